-- Settle a lost claim: release its reservation if it took effect, and fence the reservation
-- in the record's hash, so that the claim, should it still arrive (queued on a connection the
-- store replaced), writes nothing. The record's own fields go; other fences stay. The hash
-- keeps, in 'fu', when its last fence ends (now + ARGV[3] ms): no expiry set on it (a fence
-- alone, a completed record's retention, a release) ends before that. Always a write, so a
-- caller that waits for replicas confirms it.
local released = 0
if redis.call('HGET', KEYS[1], 'token') == ARGV[1] then
  redis.call('HDEL', KEYS[1], 'fp', 'token', 'at', 'until', 'tko', 'resp', 'seen')
  released = 1
end
local time = redis.call('TIME')
local ends = time[1] * 1000 + math.floor(time[2] / 1000) + tonumber(ARGV[3])
local before = tonumber(redis.call('HGET', KEYS[1], 'fu'))
if not before or before < ends then redis.call('HSET', KEYS[1], 'fu', ends) end
redis.call('HSET', KEYS[1], 'f:' .. ARGV[1], '1')
if redis.call('HEXISTS', KEYS[1], 'fp') == 0 then
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
else
  -- A completed record's expiry, if any, runs at least as long as the fence.
  local ttl = redis.call('PTTL', KEYS[1])
  if ttl >= 0 and ttl < tonumber(ARGV[3]) then redis.call('PEXPIRE', KEYS[1], ARGV[3]) end
end
if released == 1 then redis.pcall('PUBLISH', ARGV[2], KEYS[1]) end
return released
