-- prelude.lua: the Lua several scripts share, as local functions. Redis scripts cannot
-- include files, so the loader (broker/lua/__init__.py) puts this before every script: the
-- text Redis runs, and the SHA it knows a script by, are of this and the script together.
-- The endpoint counts that admission trusts move here, in `send`/`admit` and `release`,
-- and in first.lua, start.lua and reclaim.lua (broker/counters.py lists every writer).
-- A script names the keys of those counts once, as a table:
--   counts = {inflight = key, unstarted = key, transit = key, users = key}

-- Redis's clock in ms (scripts replicate their effects, so reading it is allowed).
local function now_ms()
  local t = redis.call('TIME')
  return t[1] * 1000 + math.floor(t[2] / 1000)
end

-- A ready entry is gone for good: acknowledged (it left the pending list) and deleted (it
-- holds the payload).
local function drop_entry(ready, group, entry)
  redis.call('XACK', ready, group, entry)
  redis.call('XDEL', ready, entry)
end

-- A job goes to `endpoint`. Its ready entry carries the payload and what a worker needs to
-- call the engine at once, an engine priority when `to.priority` (band first, then how many
-- jobs its user already has in the engine: lower is sooner, so a light user's request passes
-- a flood), and for a job taken back mid-answer (park.lua) the result entry id it goes on
-- from ('rq'). The job hash records the move ('nw' 1: its user had nothing in the engine, a
-- newcomer) and the user's count rises; the endpoint's counts rise by `admit`, once per call.
-- to: {ready = key, maxlen = n, priority = bool, now = ms}, the same for every job of a call
-- job, job_id: its hash and id; f: its fields 'st', 'k', 's', 'b', 'u', 'qe', 'rsq', 'rsm'
-- in this order (as dispatch.lua reads them; positions, not names: dispatch.lua sends up to
-- 64 per call); band_number: 1 = most urgent. Returns the ready entry id, and the user's
-- jobs in the engine before this one (0: a newcomer).
local function send(to, counts, endpoint, job, job_id, payload, f, band_number, queued_ms)
  local in_engine = redis.call('HINCRBY', counts.users, f[5], 1) - 1
  local priority = ''
  if to.priority then
    priority = (band_number - 1) * 1000000 + in_engine
  end
  -- 'tk': the worker records the answer's token ids, so that it can go on where it is cut
  local fields = {'j', job_id, 'ep', endpoint, 'p', payload, 'k', f[2], 's', f[3], 'b', f[4],
    'u', f[5], 'pr', priority, 'tk', f[8] or ''}
  if f[7] then  -- taken back mid-answer (park.lua): it goes on, writing from this entry id
    fields[#fields + 1] = 'rq'
    fields[#fields + 1] = f[7]
  end
  local entry = redis.call('XADD', to.ready, 'MAXLEN', '~', to.maxlen, '*', unpack(fields))
  redis.call('HSET', job, 'st', 'dispatched', 'tq', queued_ms, 'td', to.now, 'ep', endpoint,
    're', entry)
  if in_engine == 0 then
    redis.call('HSET', job, 'nw', 1)
  end
  return entry, in_engine
end

-- `n` jobs sent to `endpoint` (by `send`): in flight, without a first token, and on their
-- way until a worker starts them. `release` takes each back.
local function admit(counts, endpoint, n)
  redis.call('HINCRBY', counts.inflight, endpoint, n)
  redis.call('HINCRBY', counts.unstarted, endpoint, n)
  redis.call('HINCRBY', counts.transit, endpoint, n)
end

-- A dispatched or running job (state `st`) leaves `endpoint`: it ended, or was taken back
-- out of the engine. Each count its dispatch raised falls again. Its first-token mark 'ft'
-- is set here when missing, so it leaves the unstarted count exactly once, whichever of
-- this and first.lua comes first.
local function release(counts, job, st, endpoint, user)
  redis.call('HINCRBY', counts.inflight, endpoint, -1)
  if redis.call('HINCRBY', counts.users, user, -1) <= 0 then
    redis.call('HDEL', counts.users, user)
  end
  if redis.call('HSETNX', job, 'ft', 1) == 1 then  -- it left before its first token
    redis.call('HINCRBY', counts.unstarted, endpoint, -1)
  end
  if st == 'dispatched' then  -- before a worker started it
    redis.call('HINCRBY', counts.transit, endpoint, -1)
  end
end

-- A dispatched or running job (state `st`) that left its endpoint (`release`) without
-- output goes back to the queue, taken from the attempt that ran it (park.lua, reroute.lua):
-- queued with its payload in its hash (dispatch.lua takes it from there), no worker ('wk'
-- '-': a late completion by the one that ran it is refused), no first-token mark (it is
-- unstarted until its next first output), and its start not counted against
-- job_max_attempts. A fence entry <g>-0 in its result stream (`results`), g being the times
-- it was taken back ('pk'), refuses every later write of that attempt, however many are
-- still on their way (result entry ids only grow); 'rsq' tells its next attempt to write
-- <g>-1, <g>-2... Returns g.
local function take_back(job, results, st, payload)
  redis.call('HDEL', job, 'ft', 'ep', 're')
  redis.call('HSET', job, 'st', 'queued', 'p', payload, 'wk', '-')
  if st == 'running' then
    redis.call('HINCRBY', job, 'att', -1)
  end
  local taken = redis.call('HINCRBY', job, 'pk', 1)
  redis.call('XADD', results, taken .. '-0', 'pk', 1)
  redis.call('HSET', job, 'rsq', taken)
  return taken
end

-- The first output entry of a job's result stream (`results`), or nil when it holds none.
-- park.lua adds a fence entry ('pk') each time it takes the job back, `taken` times at most
-- ('pk' of the job hash), start.lua at most one acceptance mark ('ok') per attempt, and
-- every other entry is output; so if any entry is output, one of the first
-- 2 x (`taken` + 1) is.
local function first_output(results, taken)
  local count = 2 * ((tonumber(taken) or 0) + 1)
  local first = redis.call('XRANGE', results, '-', '+', 'COUNT', count)
  for _, e in ipairs(first) do
    if e[2][1] ~= 'pk' and e[2][1] ~= 'ok' then
      return e
    end
  end
  return nil
end

-- Quotas (broker.quotas). A tenant's or a user's counters are one hash of the UTC minute
-- and day it counts, numbered from the epoch ('mi', 'di'), and the tokens and requests of
-- each ('mt', 'mr', 'dt', 'dr'); a window that has passed counts 0, and the next charge
-- starts the window of now in its place. The hash lasts to the end of the day after the
-- day of its last charge. The windows' lengths are broker.quotas's MINUTE_MS and DAY_MS.
local MINUTE_MS, DAY_MS = 60000, 86400000

local function quota_windows(now)
  return math.floor(now / MINUTE_MS), math.floor(now / DAY_MS)
end

-- The counters of `key` in the windows `minute` and `day`: {tokens this minute, tokens this
-- day, requests this minute, requests this day}.
local function quota_counts(key, minute, day)
  local h = redis.call('HMGET', key, 'mi', 'mt', 'mr', 'di', 'dt', 'dr')
  local m, d = tonumber(h[1]) == minute, tonumber(h[4]) == day
  return {m and tonumber(h[2]) or 0, d and tonumber(h[5]) or 0,
    m and tonumber(h[3]) or 0, d and tonumber(h[6]) or 0}
end

-- Charge `tokens` and one request to `key`'s windows `minute` and `day` (its `counts` in
-- them, raised in place); `minute` nil: to the day alone (a batch line, as it ends).
local function quota_charge(key, minute, day, counts, tokens)
  counts[2], counts[4] = counts[2] + tokens, counts[4] + 1
  redis.call('HSET', key, 'di', day, 'dt', counts[2], 'dr', counts[4])
  if minute then
    counts[1], counts[3] = counts[1] + tokens, counts[3] + 1
    redis.call('HSET', key, 'mi', minute, 'mt', counts[1], 'mr', counts[3])
  end
  redis.call('PEXPIREAT', key, (day + 2) * DAY_MS)
end

-- Whether a job that ends without a usage report produced output: a first output ('ft',
-- read before `release` marks a job that left without one), or output of an attempt
-- taken back mid-answer ('pkm'). Its quota then keeps its estimate, else refunds it.
local function had_output(job)
  local f = redis.call('HMGET', job, 'ft', 'pkm')
  return f[1] == '1' or (tonumber(f[2]) or 0) > 0
end

-- A job charged to quotas (enqueue.lua: 'qc' its estimate, 'qm' the minute it was charged
-- in, 'q1' and 'q2' its counters' keys) ends, exactly once: `spent` is the usage JSON it
-- reported, true when it produced output without one, false when it never produced output.
-- Its charge is corrected to the usage, stays (true), or is refunded with its request
-- (false), in the windows it was made in while they are counted (a window that has passed
-- keeps what it had). A batch line ('qm' absent) was not charged: it is now, its usage (or
-- its estimate) and one request, in the day it ends.
local function quota_settle(charged, minute, quotas, now, spent)
  local tokens, requests = -charged, -1
  if type(spent) == 'string' then
    local ok, usage = pcall(cjson.decode, spent)  -- a job must end, whatever it reported
    local used = ok and type(usage) == 'table' and ((tonumber(usage['prompt_tokens']) or 0)
      + (tonumber(usage['completion_tokens']) or 0)) or charged
    tokens, requests = used - charged, 0
  elseif spent then
    tokens, requests = 0, 0
  end
  if not minute then
    if spent then
      local m, day = quota_windows(now)
      for _, key in ipairs(quotas) do
        quota_charge(key, nil, day, quota_counts(key, m, day), charged + tokens)
      end
    end
    return
  end
  local day = math.floor(minute * MINUTE_MS / DAY_MS)
  for _, key in ipairs(quotas) do
    local w = redis.call('HMGET', key, 'mi', 'di')
    for i, window in ipairs({minute, day}) do
      if tonumber(w[i]) == window then
        local unit = i == 1 and 'm' or 'd'
        if tokens ~= 0 then redis.call('HINCRBY', key, unit .. 't', tokens) end
        if requests ~= 0 then redis.call('HINCRBY', key, unit .. 'r', requests) end
      end
    end
  end
end

-- The job ends as `state` (the caller checked it had not ended): its times, its end entry
-- (`err`: the error JSON, or ''), its quotas settled (`spent`: quota_settle's), and the
-- expiry of its record and results after `ttl` seconds; a batch line ('kt') is kept until
-- its batch has collected the result. A payload still in the hash (a job taken back by
-- park.lua) goes.
local function finish(job, results, state, err, ttl, now, spent)
  local f = redis.call('HMGET', job, 'kt', 'qc', 'qm', 'q1', 'q2')
  if f[2] then
    local quotas = {f[4], f[5] or nil}
    quota_settle(tonumber(f[2]), tonumber(f[3]), quotas, now, spent)
  end
  redis.call('HSET', job, 'st', state, 'te', now)
  redis.call('HDEL', job, 'p')
  redis.call('XADD', results, '*', 'end', state, 'e', err)
  local keep = f[1] or ttl
  redis.call('EXPIRE', results, keep)
  redis.call('EXPIRE', job, keep)
end

-- A job joined its user's queue in `band` (an entry, or the parked list): the band's queued
-- count rises, and a user who was not backlogged joins the band's backlog at its fairness
-- clock, so idle time is never banked as credit (and a newcomer is served before anyone is
-- served twice in a row), and counts for the tenant (`tenant_field` of meta). The wake
-- message names such a newcomer, so a dispatcher can plan without reading the backlog.
-- q: {queued = key, backlog = key, meta = key, join = the band's clock field, wake = channel}
local function join_queue(q, band, user, tenant_field)
  redis.call('HINCRBY', q.queued, band, 1)
  if redis.call('ZSCORE', q.backlog, user) then
    redis.call('PUBLISH', q.wake, 'q')
    return
  end
  local join = redis.call('HGET', q.meta, q.join) or '0'
  redis.call('ZADD', q.backlog, join, user)
  if tenant_field then
    redis.call('HINCRBY', q.meta, tenant_field, 1)
  end
  redis.call('PUBLISH', q.wake, 'n\n' .. band .. '\n' .. join .. '\n' .. user)
end

-- A job left its user's queue in a band. With nothing left there nor parked, the stream goes
-- and the user leaves the band's backlog, no longer counted for the tenant (read from `job`,
-- a job of theirs in that band; nil: not counted). Returns true when the queue is empty.
local function leave_queue(queue, parked, backlog, meta, user, job)
  if redis.call('XLEN', queue) > 0 or redis.call('LLEN', parked) > 0 then
    return false
  end
  redis.call('DEL', queue)
  if redis.call('ZREM', backlog, user) == 1 and job then
    local tenant_field = redis.call('HGET', job, 'tnf')
    if tenant_field then
      redis.call('HINCRBY', meta, tenant_field, -1)
    end
  end
  return true
end
