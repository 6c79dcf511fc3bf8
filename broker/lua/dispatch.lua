-- dispatch.lua: move the planned users' head jobs to the ready stream, for one endpoint,
-- and report the model's state afterwards (so the dispatcher needs no separate read).
-- Atomic per call, so two dispatchers that briefly both own a model can never dispatch
-- the same job twice: a job leaves its user queue exactly once, here. The endpoint's cap
-- is checked here too, so a plan made from a stale view can never over-admit.
-- KEYS[1] ready stream   fq:{m}:ready
-- KEYS[2] inflight hash  fq:{m}:inflight
-- KEYS[3] meta hash      fq:{m}:meta
-- KEYS[4] unstarted hash fq:{m}:unstarted
-- KEYS[5] user counts    fq:{m}:users  (user -> jobs dispatched and not yet ended)
-- KEYS[6] queued counts  fq:{m}:queued (band -> jobs queued)
-- KEYS[7] transit hash   fq:{m}:transit (endpoint -> jobs dispatched, not yet started)
-- KEYS[8 .. 7+B]         band backlog zsets fq:{m}:bk:{band}, one per band, in priority order
-- KEYS[8+B .. 7+B+n]     user queue streams fq:{m}:q:{band}:{user}, one per pick
-- ARGV[1] endpoint   ARGV[2] job key prefix (fq:{m}:job:)   ARGV[3] ready stream max length
-- ARGV[4] endpoint's in-flight cap   ARGV[5] depth of the reported backlogs   ARGV[6] B
-- ARGV[7] 1: give each job an engine priority (vLLM --scheduling-policy priority), else 0
-- ARGV[8] the model's recent dispatch rate in jobs/s, '' if not measured (kept in meta)
-- ARGV[9] the endpoint's in-flight cap for users who already have a job in the engine
--   (its free batch slots, less those kept for newcomers), '' for none: a pick of such a
--   user beyond it is skipped and the user keeps their place
-- ARGV[10] 1: also report how many jobs each reported backlogged user has in the engine
-- ARGV[11] parked-jobs key prefix (fq:{m}:qf:): a user's jobs taken back out of the engine
--   (park.lua) are the list <prefix><band>:<user>, served before the user's queue stream
-- ARGV[12 .. 11+B]   meta join field of each band ("join:{band}")
-- ARGV[12+B .. 11+2B]   band names
-- then per pick i, from a = 12+2B+4(i-1): ARGV[a] band number (1..B), ARGV[a+1] user,
--   ARGV[a+2] user's score after service, ARGV[a+3] the band's join score after service;
--   a score after service of 'cost' means: charge the job's own estimated cost on top of
--   the user's score, and let newcomers join at the user's score before the charge
--   (token-fair). The charge is cost x (the tenant's backlogged users) / the key's weight:
--   tenants share by weight, and users inside a tenant share their tenant's part equally.
-- The ready entry carries the payload (moved from the queue entry), so a worker can call
-- the engine as soon as it reads the entry; the entry is deleted when the job ends.
-- An engine priority orders by band first, then by how many jobs the user already has in
-- the engine (lower is sooner), so a light user's request passes a flood in the engine.
-- Returns {job ids (one per pick, '' where the queue was empty or the cap reached),
--          backlog of band 1 (user, score, ...), ..., backlog of band B,
--          join scores of the bands and the express sequence 'xs',
--          in-flight hash (endpoint, count, ...), unstarted hash,
--          how many of the jobs dispatched the engine does not stream ('s' 0: admission
--          counts those apart: fairq cannot see when they leave the engine's queue),
--          with ARGV[10] = 1: per band, the jobs in the engine of each reported user}.
local now = now_ms()
local bands = tonumber(ARGV[6])
local cap = tonumber(ARGV[4])
local served_cap = tonumber(ARGV[9])  -- nil: no bound of its own
local ids = {}
local plain = 0  -- jobs dispatched that the engine does not stream
local sent = 0   -- jobs dispatched by this call
local FIXED = 7  -- KEYS before the band backlogs
local picks = #KEYS - FIXED - bands
local to = {ready = KEYS[1], maxlen = ARGV[3], priority = ARGV[7] == '1', now = now}
local counts = {inflight = KEYS[2], unstarted = KEYS[4], transit = KEYS[7], users = KEYS[5]}
-- The endpoint's in-flight count, the bands' queued counts and join clocks change once per
-- call, after the picks, by what the picks did: fewer commands per pick (each one's
-- arguments and reply are allocations inside Redis, the cost that grows with a big heap).
local inflight = tonumber(redis.call('HGET', KEYS[2], ARGV[1]) or '0')
local popped = {}  -- band -> jobs taken from its queues
local joins = {}   -- band -> its join score after the last pick that served it

-- The user's next job: a parked one first (its payload is in its hash: nil here), else the
-- head entry of the user's queue, with its payload ({'j', id, 'p', payload}).
local function pop_head(queue, parked)
  local job_id = redis.call('LPOP', parked)
  if job_id then
    return job_id, nil
  end
  local head = redis.call('XRANGE', queue, '-', '+', 'COUNT', 1)
  if #head == 0 then
    return nil
  end
  redis.call('XDEL', queue, head[1][1])
  return head[1][2][2], head[1][2][4]
end

-- The job goes to the endpoint (prelude.lua's send, as enqueue.lua's express sends), if it
-- is still queued; its id, or '' when it is not.
local function to_ready(job, job_id, payload, band)
  local f = redis.call('HMGET', job, 'st', 'k', 's', 'b', 'u', 'qe', 'rsq', 'rsm')
  if f[1] ~= 'queued' then
    return ''
  end
  if not payload then  -- parked (park.lua), or queued before payloads moved to the entry
    payload = redis.call('HGET', job, 'p')
    redis.call('HDEL', job, 'p')
  end
  local queued_ms = string.match(f[6] or '', '^%d+') or now  -- 'qe' is 'ms-seq'
  send(to, counts, ARGV[1], job, job_id, payload, f, band, queued_ms)
  sent = sent + 1
  if f[3] == '0' then
    plain = plain + 1
  end
  return job_id
end

-- A user with a job in the engine is admitted only below the served cap (kept slots).
local function may_serve(user)
  if inflight + sent >= cap then
    return false
  end
  return not served_cap or inflight + sent < served_cap
    or tonumber(redis.call('HGET', KEYS[5], user) or '0') == 0
end

for i = 1, picks do
  local a = 12 + 2 * bands + 4 * (i - 1)
  local band = tonumber(ARGV[a])
  local backlog, queue, user = KEYS[FIXED + band], KEYS[FIXED + bands + i], ARGV[a + 1]
  local parked = ARGV[11] .. ARGV[11 + bands + band] .. ':' .. user
  ids[i] = ''
  if may_serve(user) then
    local score, join = ARGV[a + 2], ARGV[a + 3]
    local job_id, payload = pop_head(queue, parked)
    local job = job_id and ARGV[2] .. job_id
    if job_id then
      popped[band] = (popped[band] or 0) + 1
      ids[i] = to_ready(job, job_id, payload, band)
      if score == 'cost' then
        local f = redis.call('HMGET', job, 'ce', 'w', 'tnf')
        local users = tonumber(redis.call('HGET', KEYS[3], f[3] or '') or '1')
        local per_token = math.max(users, 1) / tonumber(f[2] or '1')
        join = redis.call('ZSCORE', backlog, user) or '0'
        score = tonumber(join) + tonumber(f[1] or '0') * per_token
        redis.call('HSET', job, 'cw', per_token)  -- complete.lua corrects to actual usage
      end
      joins[band] = join
    end
    if not leave_queue(queue, parked, backlog, KEYS[3], user, job) and score ~= 'cost' then
      redis.call('ZADD', backlog, 'XX', score, user)
    end
  end
end

for band = 1, bands do
  if popped[band] then
    redis.call('HINCRBY', KEYS[6], ARGV[11 + bands + band], -popped[band])
    redis.call('HSET', KEYS[3], ARGV[11 + band], joins[band])
  end
end
if sent > 0 then
  admit(counts, ARGV[1], sent)
end
if ARGV[8] ~= '' then
  redis.call('HSET', KEYS[3], 'rate', ARGV[8], 'rate_ms', now)
end
-- A dispatch uses the room an express grant was computed from: revoke it, and bump the
-- sequence so a grant computed before this dispatch is refused (grant.lua).
if sent > 0 then
  redis.call('HDEL', KEYS[3], 'xep', 'xexp')
  redis.call('HINCRBY', KEYS[3], 'xs', 1)
end

local out = {ids}
local depth = tonumber(ARGV[5])
local join_fields = {}
local reported = {}
for b = 1, bands do
  reported[b] = redis.call('ZRANGE', KEYS[FIXED + b], 0, depth - 1, 'WITHSCORES')
  out[#out + 1] = reported[b]
  join_fields[b] = ARGV[11 + b]
end
join_fields[bands + 1] = 'xs'
out[#out + 1] = redis.call('HMGET', KEYS[3], unpack(join_fields))
out[#out + 1] = redis.call('HGETALL', KEYS[2])
out[#out + 1] = redis.call('HGETALL', KEYS[4])
out[#out + 1] = plain
if ARGV[10] == '1' then
  for b = 1, bands do
    local counts = {}
    for j = 1, #reported[b], 2 do
      counts[#counts + 1] = redis.call('HGET', KEYS[5], reported[b][j]) or '0'
    end
    out[#out + 1] = counts
  end
end
return out
