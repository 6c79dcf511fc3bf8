-- reroute.lua: a worker hands back a job whose engine never took it (no connection, the
-- connection lost before the engine answered, or 503: a replica that is going away), so
-- that the dispatcher sends it to an endpoint that is there. Only a job with no output in
-- its result stream: nothing was generated for its client, so it starts again from scratch
-- and its client sees nothing twice. The job keeps its id and its result stream.
-- It leaves its endpoint as an ended job does (prelude.lua's release), is fenced and queued
-- again as park.lua does a job without output (prelude.lua's take_back: a late write of
-- this attempt is refused), and joins the *head* of its user's line (the parked list that
-- dispatch.lua serves before the user's queue stream): it was already picked fairly once.
-- Its start is not counted against job_max_attempts (that bound is for workers that die);
-- its hand-backs are counted in 'rr' and bounded by ARGV[4].
-- KEYS[1] job hash        fq:{m}:job:{id}
-- KEYS[2] result stream   fq:{m}:out:{id}
-- KEYS[3] ready stream    fq:{m}:ready
-- KEYS[4] inflight hash   fq:{m}:inflight
-- KEYS[5] unstarted hash  fq:{m}:unstarted
-- KEYS[6] transit hash    fq:{m}:transit
-- KEYS[7] user counts     fq:{m}:users
-- KEYS[8] queued counts   fq:{m}:queued
-- KEYS[9] meta hash       fq:{m}:meta
-- KEYS[10] band backlog   fq:{m}:bk:{band} of the job's band
-- KEYS[11] parked list    fq:{m}:qf:{band}:{user} of the job's band and user
-- KEYS[12] handed zset    fq:{m}:handed ("endpoint\njob id": start.lua's)
-- ARGV[1] the worker handing it back   ARGV[2] the ready entry of its attempt
-- ARGV[3] ready consumer group   ARGV[4] most hand-backs per job   ARGV[5] band
-- ARGV[6] user   ARGV[7] job id   ARGV[8] wake channel
-- Returns {outcome, hand-backs so far}; outcome:
--   'rerouted'  queued again at the head of its user's line (the count includes this one)
--   'exhausted' it was handed back ARGV[4] times already: left as it is, for the worker to
--               end failed
--   'output'    its result stream holds output: left as it is (a rerun would repeat text)
--   'stale'     not this attempt's any more (ended, taken back by park.lua, or another
--               worker's after a lapsed lease): left alone, and the worker drops it
local f = redis.call('HMGET', KEYS[1], 'st', 'wk', 're', 'ep', 'pk', 'rr', 'tnf')
local st, endpoint, handed_back = f[1], f[4], tonumber(f[6] or '0')
if st ~= 'running' or f[2] ~= ARGV[1] or f[3] ~= ARGV[2] or not endpoint then
  return {'stale', handed_back}
end
if first_output(KEYS[2], f[5]) then
  return {'output', handed_back}
end
if handed_back >= tonumber(ARGV[4]) then
  return {'exhausted', handed_back}
end
local entry = redis.call('XRANGE', KEYS[3], ARGV[2], ARGV[2])[1]
local payload = nil
if entry then
  for i = 1, #entry[2], 2 do
    if entry[2][i] == 'p' then payload = entry[2][i + 1] end
  end
end
if not payload then  -- the entry holds the payload; without it the job cannot run again
  return {'stale', handed_back}
end
drop_entry(KEYS[3], ARGV[3], ARGV[2])
release({inflight = KEYS[4], unstarted = KEYS[5], transit = KEYS[6], users = KEYS[7]},
  KEYS[1], st, endpoint, ARGV[6])
redis.call('ZREM', KEYS[12], endpoint .. '\n' .. ARGV[7])  -- not at that engine after all
take_back(KEYS[1], KEYS[2], st, payload)
handed_back = redis.call('HINCRBY', KEYS[1], 'rr', 1)
redis.call('LPUSH', KEYS[11], ARGV[7])
join_queue({queued = KEYS[8], backlog = KEYS[10], meta = KEYS[9], join = 'join:' .. ARGV[5],
  wake = ARGV[8]}, ARGV[5], ARGV[6], f[7])
return {'rerouted', handed_back}
