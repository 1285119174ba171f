-- Renew: a new lease, only while pending under this reservation.
if redis.call('HGET', KEYS[1], 'token') ~= ARGV[1] then return 0 end
local now = redis.call('TIME')
redis.call('HSET', KEYS[1], 'until', now[1] * 1000 + math.floor(now[2] / 1000) + tonumber(ARGV[2]))
return 1
