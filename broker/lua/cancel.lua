-- cancel.lua: end a job as cancelled, wherever it is, unless it has ended already.
-- Its release of a dispatched job mirrors complete.lua's: change both together.
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
local f = redis.call('HMGET', KEYS[1], 'st', 'qe', 're', 'ep', 'tnf')
local st, qentry, rentry, endpoint = f[1], f[2], f[3], f[4]
if not st then
  return ''
end
if st ~= 'queued' and st ~= 'dispatched' and st ~= 'running' then
  return st
end
if st == 'queued' then
  redis.call('XDEL', KEYS[5], qentry)
  redis.call('LREM', KEYS[12], 0, ARGV[1])
  redis.call('HINCRBY', KEYS[9], ARGV[8], -1)
  if redis.call('XLEN', KEYS[5]) == 0 and redis.call('LLEN', KEYS[12]) == 0 then
    redis.call('DEL', KEYS[5])
    if redis.call('ZREM', KEYS[6], ARGV[6]) == 1 and f[5] then
      redis.call('HINCRBY', KEYS[10], f[5], -1)
    end
  end
else
  redis.call('HINCRBY', KEYS[4], endpoint, -1)
  if redis.call('HINCRBY', KEYS[8], ARGV[6], -1) <= 0 then
    redis.call('HDEL', KEYS[8], ARGV[6])
  end
  if redis.call('HSETNX', KEYS[1], 'ft', 1) == 1 then  -- ended before its first token
    redis.call('HINCRBY', KEYS[7], endpoint, -1)
  end
  if st == 'dispatched' then  -- cancelled before a worker started it
    redis.call('HINCRBY', KEYS[11], endpoint, -1)
  end
  redis.call('XACK', KEYS[3], ARGV[2], rentry)
  redis.call('XDEL', KEYS[3], rentry)
  redis.call('PUBLISH', ARGV[5], ARGV[1])
end
local t = redis.call('TIME')
local now_ms = t[1] * 1000 + math.floor(t[2] / 1000)
redis.call('HSET', KEYS[1], 'st', ARGV[7], 'te', now_ms)
redis.call('HDEL', KEYS[1], 'p')
redis.call('XADD', KEYS[2], '*', 'end', ARGV[7], 'e', '')
-- Batch API: a batch line ('kt') is kept until its batch has collected the result.
local ttl = redis.call('HGET', KEYS[1], 'kt') or ARGV[3]
redis.call('EXPIRE', KEYS[2], ttl)
redis.call('EXPIRE', KEYS[1], ttl)
redis.call('PUBLISH', ARGV[4], 'e')
return st
