-- forget.lua: remove the ready group's consumers that hold nothing and have not read for
-- long: the names of workers that stopped or died. Without this the group keeps one per
-- worker process ever started. Atomic, so a consumer that takes an entry between the
-- look and the removal keeps it (XGROUP DELCONSUMER drops a consumer's pending entries).
-- A live worker reads every few seconds (a blocking XREADGROUP counts), so it is never
-- this idle; one removed by mistake is made again by its next read.
-- KEYS[1] ready stream   fq:{m}:ready
-- ARGV[1] ready consumer group   ARGV[2] idle time in ms from which a consumer is gone
-- Returns the names removed.
local out = {}
for _, consumer in ipairs(redis.call('XINFO', 'CONSUMERS', KEYS[1], ARGV[1])) do
  local f = {}
  for i = 1, #consumer, 2 do
    f[consumer[i]] = consumer[i + 1]
  end
  if f['pending'] == 0 and f['idle'] >= tonumber(ARGV[2]) then
    redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], f['name'])
    out[#out + 1] = f['name']
  end
end
return out
