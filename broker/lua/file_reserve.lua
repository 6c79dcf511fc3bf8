-- file_reserve.lua: count a file against its owner's quota, or refuse it. First the owner's
-- files whose end has passed are released (their own keys expired with them, EXPIREAT), so
-- an expired file frees its share at the owner's next upload. One script: two uploads
-- racing for the last of a quota cannot both pass, whichever gateway replica runs them.
-- KEYS[1] held     fq:files:{owner}:held   file id -> bytes; '*' -> their total
-- KEYS[2] ends     fq:files:{owner}:ends   file id -> when it stops counting (unix s)
-- KEYS[3] listed   fq:files:{owner}        the owner's listing (an ended file leaves it)
-- ARGV[1] file id   ARGV[2] its bytes   ARGV[3] when it stops counting (unix s)
-- ARGV[4] the most bytes   ARGV[5] the most files (0: no limit; a batch's output files)
-- A file id counted already (a batch's output written again) is counted anew, its old
-- size replaced.
-- Returns {outcome, files, bytes}: outcome 0 counted, 1 too many files, 2 too many bytes;
-- files and bytes: what the owner held before this call (after the release).
local now = tonumber(redis.call('TIME')[1])
for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now)) do
  redis.call('HINCRBY', KEYS[1], '*', -tonumber(redis.call('HGET', KEYS[1], id) or '0'))
  redis.call('HDEL', KEYS[1], id)
  redis.call('ZREM', KEYS[2], id)
  redis.call('ZREM', KEYS[3], id)
end
local old = redis.call('HGET', KEYS[1], ARGV[1])
local files = redis.call('ZCARD', KEYS[2])
local total = tonumber(redis.call('HGET', KEYS[1], '*') or '0')
local more_files = old and 0 or 1
local more_bytes = tonumber(ARGV[2]) - tonumber(old or '0')
local max_bytes, max_files = tonumber(ARGV[4]), tonumber(ARGV[5])
if max_files > 0 and files + more_files > max_files then
  return {1, files, total}
end
if max_bytes > 0 and more_bytes > 0 and total + more_bytes > max_bytes then
  return {2, files, total}
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('HINCRBY', KEYS[1], '*', more_bytes)
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[1])
return {0, files, total}
