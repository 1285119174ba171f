-- Inspect: the fingerprint, whether pending, the stored status, the age in ms (-1 if
-- unknown) and whether its lease lapsed, or nothing.
local record = redis.call('HMGET', KEYS[1], 'fp', 'token', 'resp', 'at', 'until')
if not record[1] then return {} end
local time = redis.call('TIME')
local now = time[1] * 1000 + math.floor(time[2] / 1000)
local status = 0
if record[3] and string.len(record[3]) >= 3 then
  status = string.byte(record[3], 2) * 256 + string.byte(record[3], 3)
end
local pending = 0
if record[2] then pending = 1 end
local age = -1
local at = tonumber(record[4])
if at then age = now - at end
local abandoned = 0
local deadline = tonumber(record[5])
if record[2] and deadline and now >= deadline then abandoned = 1 end
return {record[1], pending, status, age, abandoned}
