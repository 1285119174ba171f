-- Release: only while pending under this reservation; a write of its own when the
-- reservation is gone and the caller waits for replicas (ARGV[3]), as complete does.
if redis.call('HGET', KEYS[1], 'token') ~= ARGV[1] then
  if ARGV[3] == '1' and redis.call('EXISTS', KEYS[1]) == 1 then redis.call('HSET', KEYS[1], 'seen', '1') end
  return 0
end
redis.call('DEL', KEYS[1])
redis.pcall('PUBLISH', ARGV[2], KEYS[1])
return 1
