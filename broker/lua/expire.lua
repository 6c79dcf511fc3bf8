-- expire.lua: end the jobs of one band that waited in the queue past their deadline: the
-- band's, or their own where a request asked for a shorter one (broker.deadlines).
-- A queued job leaves its queue and ends as cancel.lua's queued branch does (prelude.lua's
-- leave_queue and finish); the next of its user's jobs is then the head of the queue.
-- Only queued jobs are touched: one popped by dispatch.lua meanwhile is no longer in a
-- queue stream, so a job that left the queue in time is never expired.
-- A job's own deadline is the score of its id in KEYS[4] (enqueue.lua): the due ones
-- leave the index, and those still in their queue end wherever in it they are. The band's
-- deadline needs no index: queue entry ids are the enqueue times (XADD *), so a user's
-- overdue jobs are the head of the user's queue up to the cutoff. Users are walked in
-- slices (ARGV[9], ARGV[10]) to keep each call short; one emptied meanwhile shifts the
-- slice, and is caught by the next sweep.
-- KEYS[1] band backlog zset   fq:{m}:bk:{band}
-- KEYS[2] queued counts       fq:{m}:queued
-- KEYS[3] meta hash           fq:{m}:meta (backlogged users per tenant)
-- KEYS[4] own deadlines zset  fq:{m}:dl:{band} (job id, score = its deadline in ms)
-- ARGV[1] queue key prefix (fq:{m}:q:{band}:)   ARGV[2] job key prefix (fq:{m}:job:)
-- ARGV[3] result key prefix (fq:{m}:out:)   ARGV[4] band
-- ARGV[5] the band's deadline in ms, or '': the band has none (only own deadlines end)
-- ARGV[6] ttl seconds of ended jobs   ARGV[7] wake channel   ARGV[8] most jobs to expire
-- ARGV[9] first backlog rank to look at   ARGV[10] how many users to look at
-- ARGV[11] parked-jobs key prefix of the band (fq:{m}:qf:{band}:): a user with parked
--   jobs (park.lua) stays backlogged; those are never expired (their clients may have
--   received output: they were running once)
-- Returns {next rank to look at (-1: the walk is done), expired job id, ...}.
local now = now_ms()
local budget = tonumber(ARGV[8])
local first = tonumber(ARGV[9])
local out = {-1}

-- A job's queue entry was deleted: it leaves the band's count, and ends if still queued.
-- Returns its hash.
local function leave(job_id)
  local job = ARGV[2] .. job_id
  redis.call('HINCRBY', KEYS[2], ARGV[4], -1)
  if redis.call('HGET', job, 'st') == 'queued' then
    finish(job, ARGV[3] .. job_id, 'expired', '', ARGV[6], now, false)  -- never ran
    out[#out + 1] = job_id
  end
  return job
end

local due = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now, 'LIMIT', 0, budget)
if #due > 0 then
  redis.call('ZREM', KEYS[4], unpack(due))
end
for _, job_id in ipairs(due) do
  -- Still in its queue only if its entry is ('qe'): one dispatched, cancelled or parked
  -- meanwhile has left it.
  local f = redis.call('HMGET', ARGV[2] .. job_id, 'u', 'qe')
  local queue = f[1] and ARGV[1] .. f[1]
  if queue and f[2] and redis.call('XDEL', queue, f[2]) == 1 then
    leave_queue(queue, ARGV[11] .. f[1], KEYS[1], KEYS[3], f[1], leave(job_id))
  end
end
if #due == budget then
  out[1] = first  -- more may be due: call again
elseif ARGV[5] ~= '' then
  local cutoff = now - tonumber(ARGV[5])
  local users = redis.call('ZRANGE', KEYS[1], first, first + tonumber(ARGV[10]) - 1)
  for _, user in ipairs(users) do
    local queue = ARGV[1] .. user
    local overdue = redis.call('XRANGE', queue, '-', cutoff, 'COUNT', budget - #out + 1)
    local job = nil
    for _, e in ipairs(overdue) do
      redis.call('XDEL', queue, e[1])
      job = leave(e[2][2])
    end
    if job then
      leave_queue(queue, ARGV[11] .. user, KEYS[1], KEYS[3], user, job)
    end
    if #out > budget then
      out[1] = first  -- out of budget: look at this slice again
      break
    end
  end
  if out[1] == -1 and #users == tonumber(ARGV[10]) then
    out[1] = first + #users
  end
end
if #out > 1 then
  redis.call('PUBLISH', ARGV[7], 'e')
end
return out
