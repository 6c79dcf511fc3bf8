-- batch_status.lua: move a batch to a new status if it is in one of the allowed ones.
-- KEYS[1] batch hash   fq:batch:{id}
-- ARGV[1] new status   ARGV[2] allowed current statuses, comma-separated (',a,b,')
-- ARGV[3] field to stamp with the time in seconds (e.g. 'cancelling_at'), or ''
-- ARGV[4 ..] more field, value pairs to set with the move
-- Returns {1, old status} when moved, {0, current status} when not ('' if no such batch).
local st = redis.call('HGET', KEYS[1], 'status')
if not st then
  return {0, ''}
end
if not string.find(ARGV[2], ',' .. st .. ',', 1, true) then
  return {0, st}
end
redis.call('HSET', KEYS[1], 'status', ARGV[1])
if ARGV[3] ~= '' then
  redis.call('HSET', KEYS[1], ARGV[3], redis.call('TIME')[1])
end
for i = 4, #ARGV, 2 do
  redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
end
return {1, st}
