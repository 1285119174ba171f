-- Settle a lost claim: release its reservation if it took effect, and fence the reservation
-- in the record's hash, so that the claim, should it still arrive (queued on a connection the
-- store replaced), writes nothing. The record's own fields go; its other fences stay, and a
-- hash left with fences alone lives for the fence window (ARGV[3] ms). Always a write, so a
-- caller that waits for replicas confirms it.
local released = 0
if redis.call('HGET', KEYS[1], 'token') == ARGV[1] then
  redis.call('HDEL', KEYS[1], 'fp', 'token', 'at', 'until', 'tko', 'resp', 'seen')
  released = 1
end
redis.call('HSET', KEYS[1], 'f:' .. ARGV[1], '1')
if redis.call('HEXISTS', KEYS[1], 'fp') == 0 then
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
end
if released == 1 then redis.pcall('PUBLISH', ARGV[2], KEYS[1]) end
return released
