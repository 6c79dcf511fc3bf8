-- enqueue.lua: put a new job in its user's queue and mark the user backlogged, or, when
-- the dispatcher has granted express credits and nothing at this band's priority or above
-- is queued, send it straight to the ready stream (the dispatch the dispatcher would make
-- next anyway, one process hop sooner).
-- KEYS[1] job hash            fq:{m}:job:{id}
-- KEYS[2] user queue stream   fq:{m}:q:{band}:{user}
-- KEYS[3] band backlog zset   fq:{m}:bk:{band}
-- KEYS[4] meta hash           fq:{m}:meta (fairness clocks, tenants, the express grant)
-- KEYS[5] queued counts       fq:{m}:queued (band -> jobs queued)
-- KEYS[6] ready stream        fq:{m}:ready
-- KEYS[7] inflight hash       fq:{m}:inflight
-- KEYS[8] unstarted hash      fq:{m}:unstarted
-- KEYS[9] user counts         fq:{m}:users
-- KEYS[10] transit hash       fq:{m}:transit
-- KEYS[11] own deadlines zset  fq:{m}:dl:{band} (the band's jobs with a deadline of their own)
-- KEYS[12] optional: the job record of the request's Idempotency-Key
--          fq:{m}:idem:{route}:{owner}:{key digest} (broker.idempotency)
-- KEYS[#KEYS-Q+1 .. #KEYS] optional, last: the counters of the job's Q quotas
--          fq:quota:tenant:{tenant}, fq:quota:user:{user} (broker.quotas; not a model's keys:
--          quotas need a single Redis)
-- ARGV[1] job id   ARGV[2] user   ARGV[3] tenant (kept only inside ARGV[14])   ARGV[4] band
-- ARGV[5] kind (chat|completion)   ARGV[6] stream flag (0|1|2|3: broker.jobs.StreamMode)
-- ARGV[7] payload (JSON)
-- ARGV[8] max queued jobs per user   ARGV[9] wake channel   ARGV[10] meta join field
-- ARGV[11] owner (the API key's user; may differ from the fairness user of a trusted app)
-- ARGV[12] estimated cost of the job in weighted tokens   ARGV[13] the key's fairness weight
-- ARGV[14] meta field counting the tenant's backlogged users in this band
-- ARGV[15] ready stream max length   ARGV[16] 1: give the job an engine priority, else 0
-- ARGV[17] the band's number b (1 = most urgent)   ARGV[18] B, the number of bands
-- ARGV[19 .. 18+B] band names in priority order
-- ARGV[19+B .. 18+2B] their express credit fields in meta ("xn:{band}")
-- ARGV[19+2B] optional: seconds to keep the ended job (a batch line, until its batch
--   collects it; complete.lua and cancel.lua honour the job's 'kt')
-- ARGV[20+2B] 1: a streamed job that may go on where it was cut if taken back out of the
--   engine mid-answer (park.lua); stored as 'rsm' 1 only then, and its ready entry asks
--   the worker to record the answer's token ids ('tk' 1)
-- ARGV[21+2B] the job's own queue deadline in ms after now, shorter than its band's
--   (broker.deadlines), or '': a queued job with one is in KEYS[11] until expire.lua takes it
-- ARGV[22+2B] with KEYS[12]: the request's fingerprint, else '' (quotas follow)
-- ARGV[23+2B] seconds to keep the record, or ''
-- ARGV[24+2B] Q, the job's quotas (absent: none; at most 2: its tenant's, its user's)
-- ARGV[25+2B] the job's estimated tokens
-- ARGV[26+2B] 1: a batch line, never refused and charged as it ends (prelude.lua's
--   quota_settle), else 0
-- ARGV[27+2B+4(q-1) .. 30+2B+4(q-1)] quota q's limits: tokens a minute, tokens a day,
--   requests a minute, requests a day ('': none)
-- The grant lives in meta: 'xep' endpoint, 'xexp' expiry (ms), 'xs' sequence (bumped by
-- every express send, so the dispatcher's next grant is refused if computed before it),
-- 'xsv' sends left to users who already have a job in the engine (free batch slots; -1 or
-- absent: no bound): a user with nothing in the engine may take a kept slot, others not.
-- Returns {1, queue entry id} when queued, {2, ready entry id} when sent express,
-- {0, queue length} when the user's queue is full,
-- {-1} when the job id exists already (a retried submit: nothing is changed),
-- {3, job id} when the Idempotency-Key made a job already, for the same request,
-- {-2, job id} when it did for another request (nothing is changed either way), and
-- {4} when the job would pass a limit of its quotas (nothing is changed).
-- With quotas every reply is {route, its value or 0, Redis's time (ms), then per quota its
-- counts in the windows of now (prelude.lua's quota_counts)}: after the charge when the
-- job was made, else as they stand.
local bands = tonumber(ARGV[18])
local quotas = tonumber(ARGV[24 + 2 * bands] or '0')
local now = quotas > 0 and now_ms() or nil
local counts = {}  -- per quota, its counts
if quotas > 0 then
  local minute, day = quota_windows(now)
  for q = 1, quotas do
    counts[q] = quota_counts(KEYS[#KEYS - quotas + q], minute, day)
  end
end

local function reply(route, value)
  if quotas == 0 then
    return {route, value}  -- {route} when value is nil
  end
  local out = {route, value or 0, now}
  for q = 1, quotas do
    for i = 1, 4 do
      out[#out + 1] = counts[q][i]
    end
  end
  return out
end

-- A request sent again with its Idempotency-Key gets the job the key made, even while its
-- user's queue is full: that job was accepted before.
local once = (ARGV[22 + 2 * bands] or '') ~= '' and KEYS[12] or nil
if once then
  local made = redis.call('HMGET', once, 'f', 'j')
  if made[2] then
    return reply(made[1] == ARGV[22 + 2 * bands] and 3 or -2, made[2])
  end
end
local qlen = redis.call('XLEN', KEYS[2])
if qlen >= tonumber(ARGV[8]) then
  return reply(0, qlen)
end
if redis.call('EXISTS', KEYS[1]) == 1 then
  return reply(-1)
end

-- Every limit of every quota must hold the job's estimate and one request more; a batch
-- line is never refused, and charged only as it ends.
local batch_line = ARGV[26 + 2 * bands] == '1'
if quotas > 0 and not batch_line then
  local tokens = tonumber(ARGV[25 + 2 * bands])
  local need = {tokens, tokens, 1, 1}
  for q = 1, quotas do
    for i = 1, 4 do
      local limit = ARGV[26 + 2 * bands + 4 * (q - 1) + i]
      if limit ~= '' and counts[q][i] + need[i] > tonumber(limit) then
        return reply(4)
      end
    end
  end
end

now = now or now_ms()
local band = tonumber(ARGV[17])

-- Express only while a grant is live, has a credit for this band, and no job of this band
-- or a more urgent one waits: then the dispatcher would pick this job next anyway.
local function express_endpoint()
  local g = redis.call('HMGET', KEYS[4], 'xep', 'xexp', ARGV[18 + bands + band], 'xsv')
  if not g[1] or tonumber(g[2] or '0') <= now or tonumber(g[3] or '0') <= 0 then
    return nil
  end
  local served_left = tonumber(g[4] or '-1')
  if served_left == 0 and tonumber(redis.call('HGET', KEYS[9], ARGV[2]) or '0') > 0 then
    return nil
  end
  for b = 1, band do
    if tonumber(redis.call('HGET', KEYS[5], ARGV[18 + b]) or '0') > 0 then
      return nil
    end
  end
  return g[1]
end

local endpoint = express_endpoint()
-- A queued job's hash stays small (see keys.py, "a queued job's bytes"): no payload (it
-- rides in the queue entry), no field that is derived ('tn' from 'tnf', 'tq' from 'qe') or
-- at its default (owner 'o' = the user, weight 'w' = 1), so Redis keeps it as a listpack.
redis.call('HSET', KEYS[1], 'u', ARGV[2], 'b', ARGV[4], 'k', ARGV[5], 's', ARGV[6],
  'ce', ARGV[12], 'tnf', ARGV[14])
if ARGV[11] ~= ARGV[2] then redis.call('HSET', KEYS[1], 'o', ARGV[11]) end
if tonumber(ARGV[13]) ~= 1 then redis.call('HSET', KEYS[1], 'w', ARGV[13]) end
local keep = ARGV[19 + 2 * bands]
if keep and keep ~= '' then redis.call('HSET', KEYS[1], 'kt', keep) end
if ARGV[20 + 2 * bands] == '1' then redis.call('HSET', KEYS[1], 'rsm', 1) end
if once then  -- in the call that makes the job: two tries at once can never make two
  redis.call('HSET', once, 'f', ARGV[22 + 2 * bands], 'j', ARGV[1])
  redis.call('EXPIRE', once, ARGV[23 + 2 * bands])
end
if quotas > 0 then  -- charged with the job, settled at its end (prelude.lua's finish)
  local first = #KEYS - quotas
  local tokens = tonumber(ARGV[25 + 2 * bands])
  redis.call('HSET', KEYS[1], 'qc', tokens, 'q1', KEYS[first + 1])
  if quotas > 1 then redis.call('HSET', KEYS[1], 'q2', KEYS[first + 2]) end
  if not batch_line then
    local minute, day = quota_windows(now)
    redis.call('HSET', KEYS[1], 'qm', minute)
    for q = 1, quotas do
      quota_charge(KEYS[first + q], minute, day, counts[q], tokens)
    end
  end
end

if endpoint then  -- sent as dispatch.lua sends (prelude.lua's send and admit)
  local counts = {inflight = KEYS[7], unstarted = KEYS[8], transit = KEYS[10], users = KEYS[9]}
  local to = {ready = KEYS[6], maxlen = ARGV[15], priority = ARGV[16] == '1', now = now}
  -- as dispatch.lua reads a job: st, k, s, b, u, qe, rsq, rsm
  local resumable = ARGV[20 + 2 * bands] == '1' and 1 or nil
  local f = {'queued', ARGV[5], ARGV[6], ARGV[4], ARGV[2], nil, nil, resumable}
  local entry, in_engine = send(to, counts, endpoint, KEYS[1], ARGV[1], ARGV[7], f, band, now)
  admit(counts, endpoint, 1)
  -- Every band's credits shrink: they all share the one endpoint's engine queue.
  if tonumber(redis.call('HGET', KEYS[4], 'xsv') or '-1') > 0 then
    redis.call('HINCRBY', KEYS[4], 'xsv', -1)
  end
  for b = 1, bands do
    local field = ARGV[18 + bands + b]
    if tonumber(redis.call('HGET', KEYS[4], field) or '0') > 0 then
      redis.call('HINCRBY', KEYS[4], field, -1)
    end
  end
  redis.call('HINCRBY', KEYS[4], 'xs', 1)
  -- The dispatcher counts the send, and a newcomer's may need room made (preemption).
  local newcomer = in_engine == 0 and '1' or '0'
  redis.call('PUBLISH', ARGV[9], 'x\n' .. endpoint .. '\n' .. ARGV[6] .. '\n' .. newcomer)
  return reply(2, entry)
end

-- The queue entry's id is the enqueue time (dispatch.lua copies it to 'tq').
local entry = redis.call('XADD', KEYS[2], '*', 'j', ARGV[1], 'p', ARGV[7])
redis.call('HSET', KEYS[1], 'st', 'queued', 'qe', entry)
local own_ms = ARGV[21 + 2 * bands]
if own_ms ~= '' then  -- (one sent express above left no queue to wait in)
  redis.call('ZADD', KEYS[11], now + tonumber(own_ms), ARGV[1])
end
join_queue({queued = KEYS[5], backlog = KEYS[3], meta = KEYS[4], join = ARGV[10], wake = ARGV[9]},
  ARGV[4], ARGV[2], ARGV[14])
return reply(1, entry)
