-- Complete: only while pending under this reservation. A caller that waits for replicas
-- (ARGV[5]) gets a write of its own when the reservation is gone, so that its wait confirms
-- what was written before (a complete it repeats).
if redis.call('HGET', KEYS[1], 'token') ~= ARGV[1] then
  if ARGV[5] == '1' and redis.call('EXISTS', KEYS[1]) == 1 then redis.call('HSET', KEYS[1], 'seen', '1') end
  return 0
end
local now = redis.call('TIME')
local at = now[1] * 1000 + math.floor(now[2] / 1000)
redis.call('HSET', KEYS[1], 'resp', ARGV[2], 'at', at)
redis.call('HDEL', KEYS[1], 'token', 'until', 'tko')
if tonumber(ARGV[3]) > 0 then
  -- No earlier than the end of the fences the hash holds ('fu'), which a late claim needs.
  local expiry = tonumber(ARGV[3])
  local fences = tonumber(redis.call('HGET', KEYS[1], 'fu'))
  if fences and fences - at > expiry then expiry = fences - at end
  redis.call('PEXPIRE', KEYS[1], expiry)
end
redis.pcall('PUBLISH', ARGV[4], KEYS[1])
return 1
