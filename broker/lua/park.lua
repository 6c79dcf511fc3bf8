-- park.lua: take one job of the heaviest user at an endpoint back out of the engine and
-- put it at the head of its user's queue, so that a newcomer gets that batch slot.
-- A job with no output in its result stream yet (streamed and waiting for its first token,
-- or not streamed and not answered: a worker writes an answer before it completes the
-- job) starts again later from scratch; its client sees nothing twice. Failing that, a
-- streamed job marked resumable ('rsm', enqueue.lua) goes on later where it was cut, if
-- its worker recorded the prompt's token ids (field 'pt' of its first output entry; the
-- answer's are in field 't' of each entry: workers.resume_exact), or, where ARGV[11]
-- allows it, from the text it has sent.
-- Either way a fence entry ('pk') is added to its result stream, so that no late write of
-- the worker that ran it can land (result entry ids only grow: an output already on its
-- way when the job is taken back, even its first, is refused), and 'rsq' tells the next
-- attempt the generation of the entry ids it writes (the worker builds the continuation,
-- or starts afresh when nothing was written before the fence).
-- The worker running it is told on the cancel channel ("<job id> <ready entry id>"), drops
-- that attempt (closing the engine request, which aborts it there) and writes nothing more
-- for it.
-- The job leaves its endpoint as an ended one does (prelude.lua's release) and joins its
-- user's queue as a new one does (join_queue).
-- KEYS[1] ready stream    fq:{m}:ready
-- KEYS[2] inflight hash   fq:{m}:inflight
-- KEYS[3] unstarted hash  fq:{m}:unstarted
-- KEYS[4] user counts     fq:{m}:users
-- KEYS[5] transit hash    fq:{m}:transit
-- KEYS[6] queued counts   fq:{m}:queued
-- KEYS[7] meta hash       fq:{m}:meta (join scores, backlogged users per tenant)
-- ARGV[1] endpoint   ARGV[2] job key prefix (fq:{m}:job:)   ARGV[3] ready consumer group
-- ARGV[4] parked-jobs key prefix (fq:{m}:qf:)   ARGV[5] backlog key prefix (fq:{m}:bk:)
-- ARGV[6] most ready entries to look at (newest first)
-- ARGV[7] fewest jobs a user must have at the endpoint to lose one
-- ARGV[8] wake channel   ARGV[9] cancel channel   ARGV[10] result key prefix (fq:{m}:out:)
-- ARGV[11] 1: a resumable job without token ids may go on from its text; else it stays
-- ARGV[12] 0: any job as above; N > 0: only a job streamed from the engine without a first
--          token handed over (its ready entry added) within the last N ms, by Redis's clock:
--          one that may still wait for its prefill (the dispatcher clears a newcomer's
--          prefill step of such jobs). Not one the engine does not stream ('s' 0): it has no
--          output until its end, so nothing tells whether its prefill is done, and taking it
--          back would waste that.
-- Parked jobs of a (band, user) are the list fq:{m}:qf:{band}:{user}; dispatch.lua serves
-- them before the user's queue stream, and a user stays backlogged while either holds one.
-- Returns {job id, user} of the job parked, or {} when no job may be taken.
local entries = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', tonumber(ARGV[6]))
local young_ms = tonumber(ARGV[12])
local oldest_ms = 0  -- with young_ms: the oldest ready entry time a job may have
if young_ms > 0 then
  local now = redis.call('TIME')
  oldest_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000) - young_ms
end

-- Whether a resumable job whose first output entry is `first` can go on where it was cut
-- (see the header).
local function goes_on(first)
  if ARGV[11] == '1' then
    return true
  end
  for i = 1, #first[2], 2 do
    if first[2][i] == 'pt' then
      return true
    end
  end
  return false
end

local count = {}     -- user -> their jobs at the endpoint
local candidate = {} -- user -> their newest job without output: {job id, entry, payload, band}
-- user -> their oldest resumable streamed job with output (the same): the one nearest its
-- end, so that the pause does not make it the flood's last answer (the newest would be,
-- and after its resume it is the newest again: one answer would take every pause).
local resumable = {}
for _, e in ipairs(entries) do
  local f = {}
  for i = 1, #e[2], 2 do
    f[e[2][i]] = e[2][i + 1]
  end
  if f['ep'] == ARGV[1] and f['u'] then
    local user = f['u']
    count[user] = (count[user] or 0) + 1
    -- With young_ms, entries older than the bound (and all after them: newest first) and
    -- jobs not streamed only count.
    local young = young_ms == 0
      or (f['s'] ~= '0' and tonumber(string.match(e[1], '^(%d+)')) >= oldest_ms)
    if young and not candidate[user] then
      local s = redis.call('HMGET', ARGV[2] .. f['j'], 'st', 'rsm', 'pk', 'ft')
      if s[1] == 'dispatched' or s[1] == 'running' then
        local first = first_output(ARGV[10] .. f['j'], s[3])
        -- A job streamed from the engine for a whole answer ('s' 3) writes no output before
        -- its end; its first token is marked 'ft' (first.lua): it is past its prefill.
        if not first and not (young_ms > 0 and s[4]) then
          candidate[user] = {f['j'], e[1], f['p'], f['b']}
        elseif young_ms == 0 and s[2] and goes_on(first) then
          -- newest first: the last one seen stays
          resumable[user] = {f['j'], e[1], f['p'], f['b']}
        end
      end
    end
  end
end
local victim, most = nil, tonumber(ARGV[7]) - 1
for user, c in pairs(count) do
  local has = candidate[user] or resumable[user]
  if has and (c > most or (c == most and victim and user < victim)) then
    victim, most = user, c
  end
end
if not victim then
  return {}
end

local job_id, entry, payload, band = unpack(candidate[victim] or resumable[victim])
local job = ARGV[2] .. job_id
local st = redis.call('HGET', job, 'st')
drop_entry(KEYS[1], ARGV[3], entry)
release({inflight = KEYS[2], unstarted = KEYS[3], transit = KEYS[5], users = KEYS[4]},
  job, st, ARGV[1], victim)
redis.call('HDEL', job, 'ft')  -- it starts again: unstarted until its next first output
-- Queued again, with its payload in the hash (dispatch.lua takes it from there). 'wk' names
-- no worker, so a late completion by the worker that ran it is refused (complete.lua), and
-- the start it lost is not counted against job_max_attempts.
redis.call('HSET', job, 'st', 'queued', 'p', payload, 'wk', '-')
redis.call('HDEL', job, 'ep', 're')
-- Fence off the old writer. Entry ids are <generation>-<n>: the first attempt writes 0-1
-- (start.lua's acceptance mark), 0-2...; the fence is <g>-0 for the g-th time the job is
-- taken back, and the next attempt writes <g>-1... Every write of an earlier attempt,
-- however many are still on their way, has a smaller id than the fence, so Redis refuses it.
local taken = redis.call('HINCRBY', job, 'pk', 1)
redis.call('XADD', ARGV[10] .. job_id, taken .. '-0', 'pk', 1)
redis.call('HSET', job, 'rsq', taken)
if not candidate[victim] then  -- mid-answer: it goes on where it was cut
  redis.call('HINCRBY', job, 'pkm', 1)
end
if st == 'running' then
  redis.call('HINCRBY', job, 'att', -1)
end
redis.call('RPUSH', ARGV[4] .. band .. ':' .. victim, job_id)
join_queue({queued = KEYS[6], backlog = ARGV[5] .. band, meta = KEYS[7], join = 'join:' .. band,
  wake = ARGV[8]}, band, victim, redis.call('HGET', job, 'tnf'))
-- The notice names the attempt (its ready entry): the job may be dispatched again, even to
-- the same worker, before that worker reads it, and the next attempt must not be dropped.
redis.call('PUBLISH', ARGV[9], job_id .. ' ' .. entry)
return {job_id, victim}
