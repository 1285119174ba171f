-- Claim: creates the pending reservation with its lease, or reports conflict (fingerprint
-- first), pending or replay with the stored response, all in one atomic step; takes over a
-- pending record whose lease lapsed when asked to; marks a replay to be confirmed on a
-- replica when asked to. The steps are the crate's one claim decision (src/store/decide.rs),
-- in its order: a completed record past its retention is absent (its key expired in Redis);
-- another fingerprint is a conflict; the caller's own reservation is the caller's; completed
-- replays; an abandoned record is taken over when both sides allow it; pending otherwise.
-- A reservation its settling fenced (the claim arrived after it) writes nothing.
local record = redis.call('HMGET', KEYS[1], 'fp', 'token', 'resp', 'until', 'tko', 'f:' .. ARGV[2])
if record[6] then return {4} end
if record[1] then
  if record[1] ~= ARGV[1] then return {1} end
  if record[2] == ARGV[2] then return {0} end
  if record[3] then
    -- A replay the caller confirms on a replica: a write of its own after the complete,
    -- which a replica that has acknowledged it has the complete before.
    if ARGV[5] == '1' then redis.call('HSET', KEYS[1], 'seen', '1') end
    return {3, record[3]}
  end
  if ARGV[4] ~= '1' or record[5] ~= '1' then return {2} end
end
local time = redis.call('TIME')
local now = time[1] * 1000 + math.floor(time[2] / 1000)
if record[1] then
  local deadline = tonumber(record[4])
  if not deadline or now < deadline then return {2} end
end
redis.call('HSET', KEYS[1], 'fp', ARGV[1], 'token', ARGV[2], 'at', now, 'until', now + tonumber(ARGV[3]), 'tko', ARGV[4])
-- A pending record never expires, though the hash held fences that would have.
if not record[1] then redis.call('PERSIST', KEYS[1]) end
return {0}
