-- Release: only while pending under this reservation; a write of its own when the
-- reservation is gone and the caller waits for replicas (ARGV[3]), as complete does. The
-- record's fields go; the fences of lost claims' reservations stay until their end ('fu'),
-- so a late claim of theirs still finds them.
if redis.call('HGET', KEYS[1], 'token') ~= ARGV[1] then
  if ARGV[3] == '1' and redis.call('EXISTS', KEYS[1]) == 1 then redis.call('HSET', KEYS[1], 'seen', '1') end
  return 0
end
redis.call('HDEL', KEYS[1], 'fp', 'token', 'at', 'until', 'tko', 'resp', 'seen')
local ends = tonumber(redis.call('HGET', KEYS[1], 'fu'))
if ends then
  local time = redis.call('TIME')
  local left = ends - (time[1] * 1000 + math.floor(time[2] / 1000))
  if left > 0 then redis.call('PEXPIRE', KEYS[1], left) else redis.call('DEL', KEYS[1]) end
end
redis.pcall('PUBLISH', ARGV[2], KEYS[1])
return 1
