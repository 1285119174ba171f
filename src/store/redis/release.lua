-- Release: only while pending under this reservation.
if redis.call('HGET', KEYS[1], 'token') ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
redis.pcall('PUBLISH', ARGV[2], KEYS[1])
return 1
