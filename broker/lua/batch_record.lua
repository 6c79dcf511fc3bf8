-- batch_record.lua: record how one line of a batch ended, exactly once, and count it.
-- A line recorded already (a retried or repeated pass) changes nothing but its pending entry.
-- KEYS[1] batch hash     fq:batch:{id}          (counters 'completed' and 'failed')
-- KEYS[2] results hash   fq:batch:{id}:res      (line -> record)
-- KEYS[3] pending zset   fq:batch:{id}:pending
-- ARGV[1] line number   ARGV[2] counter: 'completed' or 'failed'   ARGV[3] the record
-- ARGV[4] the line's pending member, or '' (a line that was never queued)
-- Returns 1 when this call recorded the line, 0 when it was recorded before.
if ARGV[4] ~= '' then
  redis.call('ZREM', KEYS[3], ARGV[4])
end
if redis.call('HSETNX', KEYS[2], ARGV[1], ARGV[3]) == 0 then
  return 0
end
redis.call('HINCRBY', KEYS[1], ARGV[2], 1)
return 1
