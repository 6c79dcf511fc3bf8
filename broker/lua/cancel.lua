-- cancel.lua: end a job as cancelled, wherever it is, unless it has ended already: a queued
-- one leaves its queue, a dispatched or running one its endpoint (prelude.lua's release, as
-- complete.lua's) and its worker, told on the cancel channel.
-- KEYS[1] job hash            fq:{m}:job:{id}
-- KEYS[2] result stream       fq:{m}:out:{id}
-- KEYS[3] ready stream        fq:{m}:ready
-- KEYS[4] inflight hash       fq:{m}:inflight
-- KEYS[5] user queue stream   fq:{m}:q:{band}:{user}  (the job's own band and user)
-- KEYS[6] band backlog zset   fq:{m}:bk:{band}
-- KEYS[7] unstarted hash      fq:{m}:unstarted
-- KEYS[8] user counts         fq:{m}:users
-- KEYS[9] queued counts       fq:{m}:queued
-- KEYS[10] meta hash          fq:{m}:meta (backlogged users per tenant)
-- KEYS[11] transit hash       fq:{m}:transit
-- KEYS[12] parked jobs        fq:{m}:qf:{band}:{user} (park.lua: served before the queue)
-- ARGV[1] job id   ARGV[2] ready consumer group   ARGV[3] ttl seconds
-- ARGV[4] wake channel   ARGV[5] cancel channel (workers abort the engine request)
-- ARGV[6] user   ARGV[7] terminal state to record (cancelled, or expired for deadlines)
-- ARGV[8] the job's band
-- Returns the state the job was in, or '' when there is no such job.
local f = redis.call('HMGET', KEYS[1], 'st', 'qe', 're', 'ep')
local st, qentry, rentry, endpoint = f[1], f[2], f[3], f[4]
if not st then
  return ''
end
if st ~= 'queued' and st ~= 'dispatched' and st ~= 'running' then
  return st
end
-- Read before `release` marks the job: its quotas keep the estimate of one that produced
-- output, and refund one that never did (prelude.lua's finish).
local spent = had_output(KEYS[1])
if st == 'queued' then
  if qentry then  -- not a job taken back (park.lua) that was sent express: never queued
    redis.call('XDEL', KEYS[5], qentry)
  end
  redis.call('LREM', KEYS[12], 0, ARGV[1])
  redis.call('HINCRBY', KEYS[9], ARGV[8], -1)
  leave_queue(KEYS[5], KEYS[12], KEYS[6], KEYS[10], ARGV[6], KEYS[1])
else
  release({inflight = KEYS[4], unstarted = KEYS[7], transit = KEYS[11], users = KEYS[8]},
    KEYS[1], st, endpoint, ARGV[6])
  drop_entry(KEYS[3], ARGV[2], rentry)
  redis.call('PUBLISH', ARGV[5], ARGV[1])
end
finish(KEYS[1], KEYS[2], ARGV[7], '', ARGV[3], now_ms(), spent)
redis.call('PUBLISH', ARGV[4], 'e')
return st
