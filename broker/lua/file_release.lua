-- file_release.lua: a file stops counting against its owner's quota (it was deleted, or
-- its upload failed or lost to another try). Releasing a file not counted does nothing.
-- KEYS[1] held     fq:files:{owner}:held   file id -> bytes; '*' -> their total
-- KEYS[2] ends     fq:files:{owner}:ends   file id -> when it stops counting (unix s)
-- ARGV[1] file id
-- Returns the bytes released (0: it was not counted).
local size = redis.call('HGET', KEYS[1], ARGV[1])
if not size then
  return 0
end
redis.call('HINCRBY', KEYS[1], '*', -tonumber(size))
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
return tonumber(size)
