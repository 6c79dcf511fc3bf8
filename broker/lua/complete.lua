-- complete.lua: record a running job's terminal state exactly once and release it
-- (prelude.lua's finish and release, as cancel.lua's).
-- KEYS[1] job hash       fq:{m}:job:{id}
-- KEYS[2] result stream  fq:{m}:out:{id}
-- KEYS[3] ready stream   fq:{m}:ready
-- KEYS[4] inflight hash  fq:{m}:inflight
-- KEYS[5] unstarted hash fq:{m}:unstarted
-- KEYS[6] band backlog   fq:{m}:bk:{band} of the job's band
-- KEYS[7] user counts    fq:{m}:users
-- KEYS[8] dead letters   fq:{m}:dead (zset: job id -> when)
-- KEYS[9] transit hash   fq:{m}:transit
-- ARGV[1] terminal state (completed|failed)   ARGV[2] ready consumer group
-- ARGV[3] ttl seconds of the job and its results   ARGV[4] wake channel
-- ARGV[5] error JSON or ''   ARGV[6] usage JSON or ''   ARGV[7] finish reason or ''
-- ARGV[8] first-token time in ms or ''
-- ARGV[9] cost of a prompt token   ARGV[10] cost of an output token   ARGV[11] the job's user
-- ARGV[12] the worker ending the job ('' from a caller that is no worker: no check)
-- ARGV[13] the job id when it ends as a dead letter (recorded in KEYS[8]), else ''
-- ARGV[14] the ready entry of the attempt that ends ('' from a caller that is no worker)
-- A worker may end only a job it runs: one whose lease lapsed (a long pause) and that
-- another worker reclaimed is left alone, entry included (it is the other worker's now);
-- so is one that park.lua took back and dispatched again (another ready entry), even to
-- the same worker: the earlier attempt's end is stale.
-- A job charged by its estimated cost at dispatch (token-fair) has the charge corrected to
-- its reported usage, if its user is still backlogged (an idle user's score is gone).
-- Returns 1 when this call ended the job, 0 when it had already ended (e.g. cancelled);
-- the ready entry is acknowledged and deleted either way (it holds the payload).
local f = redis.call('HMGET', KEYS[1], 'st', 're', 'ep', 'wk')
local st, entry, endpoint = f[1], f[2], f[3]
if ARGV[12] ~= '' and f[4] and f[4] ~= ARGV[12] then
  return 0
end
if ARGV[14] ~= '' and f[1] and entry ~= ARGV[14] then
  return 0  -- an earlier attempt's: the job was taken back (its entry is gone with it)
end
if entry then
  drop_entry(KEYS[3], ARGV[2], entry)
end
if st ~= 'dispatched' and st ~= 'running' then
  if not st then  -- a job Redis lost in a crash: its chunks, written since, must expire too
    redis.call('EXPIRE', KEYS[2], ARGV[3])
  end
  return 0
end
local now = now_ms()
if ARGV[5] ~= '' then redis.call('HSET', KEYS[1], 'err', ARGV[5]) end
if ARGV[6] ~= '' then
  redis.call('HSET', KEYS[1], 'usage', ARGV[6])
  local c = redis.call('HMGET', KEYS[1], 'cw', 'ce')
  if c[1] then
    local usage = cjson.decode(ARGV[6])
    local actual = (tonumber(usage['prompt_tokens']) or 0) * tonumber(ARGV[9])
      + (tonumber(usage['completion_tokens']) or 0) * tonumber(ARGV[10])
    local delta = (actual - tonumber(c[2] or '0')) * tonumber(c[1])
    redis.call('ZADD', KEYS[6], 'XX', 'INCR', delta, ARGV[11])
  end
end
if ARGV[7] ~= '' then redis.call('HSET', KEYS[1], 'fin', ARGV[7]) end
-- HSETNX: first.lua set it already when the job's first output was written (the same time,
-- or an earlier attempt's that its client saw first).
if ARGV[8] ~= '' then redis.call('HSETNX', KEYS[1], 'tf', ARGV[8]) end
if ARGV[13] ~= '' then
  redis.call('ZADD', KEYS[8], now, ARGV[13])
  redis.call('ZREMRANGEBYSCORE', KEYS[8], '-inf', now - ARGV[3] * 1000)  -- their jobs expired
end
-- Its quotas are settled to its usage, or to whether it produced output (prelude.lua).
local spent = ARGV[6] ~= '' and ARGV[6] or ARGV[8] ~= '' or had_output(KEYS[1])
finish(KEYS[1], KEYS[2], ARGV[1], ARGV[5], ARGV[3], now, spent)
if endpoint then
  release({inflight = KEYS[4], unstarted = KEYS[5], transit = KEYS[9], users = KEYS[7]},
    KEYS[1], st, endpoint, ARGV[11])
end
redis.call('PUBLISH', ARGV[4], 'e')
return 1
