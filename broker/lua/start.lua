-- start.lua: a worker takes a dispatched job it read from the ready stream.
-- KEYS[1] job hash   fq:{m}:job:{id}
-- ARGV[1] worker name
-- Returns {1, payload, kind, stream flag, endpoint, attempts} when the job is now running
-- under this worker, or {0, state} when it is no longer startable (cancelled, or gone:
-- state '' ) and the worker must just acknowledge the entry.
local st = redis.call('HGET', KEYS[1], 'st')
if st ~= 'dispatched' then
  return {0, st or ''}
end
local t = redis.call('TIME')
local now_ms = t[1] * 1000 + math.floor(t[2] / 1000)
local attempts = redis.call('HINCRBY', KEYS[1], 'att', 1)
redis.call('HSET', KEYS[1], 'st', 'running', 'tr', now_ms, 'w', ARGV[1])
local f = redis.call('HMGET', KEYS[1], 'p', 'k', 's', 'ep')
return {1, f[1], f[2], f[3], f[4], attempts}
