-- Release: only while pending under this reservation; a write of its own when the
-- reservation is gone and the caller waits for replicas (ARGV[4]), as complete does. The
-- record's fields go; the fences of lost claims' reservations stay for the fence window
-- (ARGV[3] ms), so a late claim of theirs still finds them.
if redis.call('HGET', KEYS[1], 'token') ~= ARGV[1] then
  if ARGV[4] == '1' and redis.call('EXISTS', KEYS[1]) == 1 then redis.call('HSET', KEYS[1], 'seen', '1') end
  return 0
end
redis.call('HDEL', KEYS[1], 'fp', 'token', 'at', 'until', 'tko', 'resp', 'seen')
if redis.call('EXISTS', KEYS[1]) == 1 then redis.call('PEXPIRE', KEYS[1], ARGV[3]) end
redis.pcall('PUBLISH', ARGV[2], KEYS[1])
return 1
