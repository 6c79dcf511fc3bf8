-- enqueue.lua: put a new job in its user's queue and mark the user backlogged.
-- KEYS[1] job hash            fq:{m}:job:{id}
-- KEYS[2] user queue stream   fq:{m}:q:{band}:{user}
-- KEYS[3] band backlog zset   fq:{m}:bk:{band}
-- KEYS[4] meta hash           fq:{m}:meta
-- KEYS[5] queued counts       fq:{m}:queued (band -> jobs queued)
-- ARGV[1] job id   ARGV[2] user   ARGV[3] tenant   ARGV[4] band
-- ARGV[5] kind (chat|completion)   ARGV[6] stream flag (0|1)   ARGV[7] payload (JSON)
-- ARGV[8] max queued jobs per user   ARGV[9] wake channel   ARGV[10] meta join field
-- ARGV[11] owner (the API key's user; may differ from the fairness user of a trusted app)
-- ARGV[12] estimated cost of the job in weighted tokens   ARGV[13] the key's fairness weight
-- ARGV[14] meta field counting the tenant's backlogged users in this band
-- ARGV[15] optional: seconds to keep the ended job (a batch line, until its batch collects it)
-- Returns {1, queue entry id} when queued, {0, queue length} when the user's queue is full,
-- {-1} when the job id exists already (a retried submit: nothing is changed).
local qlen = redis.call('XLEN', KEYS[2])
if qlen >= tonumber(ARGV[8]) then
  return {0, qlen}
end
if redis.call('EXISTS', KEYS[1]) == 1 then
  return {-1}
end
local t = redis.call('TIME')
local now_ms = t[1] * 1000 + math.floor(t[2] / 1000)
local entry = redis.call('XADD', KEYS[2], '*', 'j', ARGV[1])
redis.call('HINCRBY', KEYS[5], ARGV[4], 1)
redis.call('HSET', KEYS[1], 'st', 'queued', 'u', ARGV[2], 'tn', ARGV[3], 'b', ARGV[4],
  'k', ARGV[5], 's', ARGV[6], 'p', ARGV[7], 'tq', now_ms, 'qe', entry, 'o', ARGV[11],
  'ce', ARGV[12], 'w', ARGV[13], 'tnf', ARGV[14])
if ARGV[15] and ARGV[15] ~= '' then redis.call('HSET', KEYS[1], 'kt', ARGV[15]) end
-- A user who was idle joins at the band's current fairness clock, so idle time is never
-- banked as credit (and a newcomer is served before anyone is served twice in a row).
-- The wake message names a newcomer, so a dispatcher can plan without reading the backlog.
if not redis.call('ZSCORE', KEYS[3], ARGV[2]) then
  local join = redis.call('HGET', KEYS[4], ARGV[10]) or '0'
  redis.call('ZADD', KEYS[3], join, ARGV[2])
  redis.call('HINCRBY', KEYS[4], ARGV[14], 1)
  redis.call('PUBLISH', ARGV[9], 'n\n' .. ARGV[4] .. '\n' .. join .. '\n' .. ARGV[2])
else
  redis.call('PUBLISH', ARGV[9], 'q')
end
return {1, entry}
