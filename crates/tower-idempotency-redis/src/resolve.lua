-- Resolve: complete a pending record, whoever reserved it.
if not redis.call('HGET', KEYS[1], 'token') then return 0 end
local now = redis.call('TIME')
local at = now[1] * 1000 + math.floor(now[2] / 1000)
redis.call('HSET', KEYS[1], 'resp', ARGV[1], 'at', at)
redis.call('HDEL', KEYS[1], 'token', 'until', 'tko')
if tonumber(ARGV[2]) > 0 then
  -- No earlier than the end of the fences the hash holds ('fu').
  local expiry = tonumber(ARGV[2])
  local fences = tonumber(redis.call('HGET', KEYS[1], 'fu'))
  if fences and fences - at > expiry then expiry = fences - at end
  redis.call('PEXPIRE', KEYS[1], expiry)
end
redis.pcall('PUBLISH', ARGV[3], KEYS[1])
return 1
