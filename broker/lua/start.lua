-- start.lua: a worker takes a dispatched job it read from the ready stream.
-- The worker may already be calling the engine (the ready entry holds the payload); this
-- records that it runs the job, or tells it to abort because the job ended meanwhile.
-- KEYS[1] job hash   fq:{m}:job:{id}
-- KEYS[2] transit hash fq:{m}:transit (endpoint -> jobs dispatched, not yet started)
-- KEYS[3] handed zset  fq:{m}:handed ("endpoint\njob id" -> when it started, ms)
-- KEYS[4] result stream fq:{m}:out:{id}
-- ARGV[1] worker name (kept in 'wk': 'w' is the key's fairness weight, from enqueue.lua)
-- ARGV[2] job id   ARGV[3] how long a start stays in the handed zset (ms)
-- ARGV[4] 1: the engine accepted the streamed request (its response was a 200), else 0
-- An accepted start adds the acceptance mark ('ok') to the result stream as the attempt's
-- entry <g>-1 (g: 'rsq', the attempt's generation; its output starts at <g>-2), so that
-- the gateway sends its client the response headers now, a step or more before the first
-- token (``gateway.sse``). Not when output has landed already (the mark would come after it).
-- Returns {1, attempts} when the job is now running under this worker, or {0, state}
-- when it is no longer startable (ended already, or gone: state '') and the worker must
-- drop it.
local st = redis.call('HGET', KEYS[1], 'st')
if st == 'running' and redis.call('HGET', KEYS[1], 'wk') == ARGV[1] then
  -- A retry by the same worker whose first call ran but whose reply was lost (a Redis
  -- restart): it still runs the job.
  return {1, tonumber(redis.call('HGET', KEYS[1], 'att'))}
end
if st ~= 'dispatched' then
  return {0, st or ''}
end
local now = now_ms()
local attempts = redis.call('HINCRBY', KEYS[1], 'att', 1)
redis.call('HSET', KEYS[1], 'st', 'running', 'tr', now, 'wk', ARGV[1])
-- It has reached the engine (the worker calls this once the engine has the request),
-- which may not show it in its metrics for a moment: the handed zset keeps recent starts
-- for the scrapes of that moment (``unseen.lua``).
local endpoint = redis.call('HGET', KEYS[1], 'ep')
redis.call('HINCRBY', KEYS[2], endpoint, -1)
redis.call('ZADD', KEYS[3], now, endpoint .. '\n' .. ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now - tonumber(ARGV[3]))
if ARGV[4] == '1' then
  local generation = redis.call('HGET', KEYS[1], 'rsq') or '0'
  local last = redis.call('XREVRANGE', KEYS[4], '+', '-', 'COUNT', 1)[1]
  if last == nil or last[1] == generation .. '-0' then  -- nothing since the fence, if any
    redis.call('XADD', KEYS[4], generation .. '-1', 'ok', '')
  end
end
return {1, attempts}
