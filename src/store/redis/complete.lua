-- Complete: only while pending under this reservation.
if redis.call('HGET', KEYS[1], 'token') ~= ARGV[1] then return 0 end
local now = redis.call('TIME')
redis.call('HSET', KEYS[1], 'resp', ARGV[2], 'at', now[1] * 1000 + math.floor(now[2] / 1000))
redis.call('HDEL', KEYS[1], 'token', 'until', 'tko')
if tonumber(ARGV[3]) > 0 then redis.call('PEXPIRE', KEYS[1], ARGV[3]) end
redis.pcall('PUBLISH', ARGV[4], KEYS[1])
return 1
