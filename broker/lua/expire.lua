-- expire.lua: end the jobs of one band that waited in the queue past the band's deadline.
-- Removing a queued job mirrors cancel.lua's queued branch (queue entry, queued count,
-- backlog and tenant count), and its end mirrors cancel.lua's: change them together.
-- Only queued jobs are touched: one popped by dispatch.lua meanwhile is no longer in a
-- queue stream, so a job that left the queue in time is never expired.
-- Queue entry ids are the enqueue times (XADD *), so a user's overdue jobs are the head of
-- the user's queue up to the cutoff. Users are walked in slices (ARGV[9], ARGV[10]) to keep
-- each call short; one emptied meanwhile shifts the slice, and is caught by the next sweep.
-- KEYS[1] band backlog zset   fq:{m}:bk:{band}
-- KEYS[2] queued counts       fq:{m}:queued
-- KEYS[3] meta hash           fq:{m}:meta (backlogged users per tenant)
-- ARGV[1] queue key prefix (fq:{m}:q:{band}:)   ARGV[2] job key prefix (fq:{m}:job:)
-- ARGV[3] result key prefix (fq:{m}:out:)   ARGV[4] band   ARGV[5] deadline in ms
-- ARGV[6] ttl seconds of ended jobs   ARGV[7] wake channel   ARGV[8] most jobs to expire
-- ARGV[9] first backlog rank to look at   ARGV[10] how many users to look at
-- ARGV[11] parked-jobs key prefix of the band (fq:{m}:qf:{band}:): a user with parked
--   jobs (park.lua) stays backlogged; those are never expired (their clients may have
--   received output: they were running once)
-- Returns {next rank to look at (-1: the walk is done), expired job id, ...}.
local t = redis.call('TIME')
local now_ms = t[1] * 1000 + math.floor(t[2] / 1000)
local cutoff = now_ms - tonumber(ARGV[5])
local budget = tonumber(ARGV[8])
local first = tonumber(ARGV[9])
local users = redis.call('ZRANGE', KEYS[1], first, first + tonumber(ARGV[10]) - 1)
local out = {-1}
for _, user in ipairs(users) do
  local queue = ARGV[1] .. user
  local overdue = redis.call('XRANGE', queue, '-', cutoff, 'COUNT', budget - #out + 1)
  local tenant_field = nil
  for _, e in ipairs(overdue) do
    local job_id = e[2][2]
    local job = ARGV[2] .. job_id
    redis.call('XDEL', queue, e[1])
    redis.call('HINCRBY', KEYS[2], ARGV[4], -1)
    local f = redis.call('HMGET', job, 'st', 'tnf', 'kt')
    tenant_field = f[2] or tenant_field
    if f[1] == 'queued' then
      local results = ARGV[3] .. job_id
      local ttl = f[3] or ARGV[6]  -- a batch line ('kt') is kept until its batch collects it
      redis.call('HSET', job, 'st', 'expired', 'te', now_ms)
      redis.call('HDEL', job, 'p')
      redis.call('XADD', results, '*', 'end', 'expired', 'e', '')
      redis.call('EXPIRE', results, ttl)
      redis.call('EXPIRE', job, ttl)
      out[#out + 1] = job_id
    end
  end
  if #overdue > 0 and redis.call('XLEN', queue) == 0
      and redis.call('LLEN', ARGV[11] .. user) == 0 then
    redis.call('DEL', queue)
    if redis.call('ZREM', KEYS[1], user) == 1 and tenant_field then
      redis.call('HINCRBY', KEYS[3], tenant_field, -1)
    end
  end
  if #out > budget then
    out[1] = first  -- out of budget: look at this slice again
    break
  end
end
if out[1] == -1 and #users == tonumber(ARGV[10]) then
  out[1] = first + #users
end
if #out > 1 then
  redis.call('PUBLISH', ARGV[7], 'e')
end
return out
