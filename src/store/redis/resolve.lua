-- Resolve: complete a pending record, whoever reserved it.
if not redis.call('HGET', KEYS[1], 'token') then return 0 end
local now = redis.call('TIME')
redis.call('HSET', KEYS[1], 'resp', ARGV[1], 'at', now[1] * 1000 + math.floor(now[2] / 1000))
redis.call('HDEL', KEYS[1], 'token', 'until', 'tko')
if tonumber(ARGV[2]) > 0 then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
redis.pcall('PUBLISH', ARGV[3], KEYS[1])
return 1
