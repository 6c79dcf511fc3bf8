-- dispatch.lua: move the planned users' head jobs to the ready stream, for one endpoint.
-- Atomic per call, so two dispatchers that briefly both own a model can never dispatch
-- the same job twice: a job leaves its user queue exactly once, here.
-- KEYS[1] ready stream   fq:{m}:ready
-- KEYS[2] inflight hash  fq:{m}:inflight
-- KEYS[3] meta hash      fq:{m}:meta
-- then per pick i (i = 1..n): KEYS[2+2i] band backlog zset, KEYS[3+2i] user queue stream
-- ARGV[1] endpoint   ARGV[2] job key prefix (fq:{m}:job:)   ARGV[3] ready stream max length
-- then per pick i: ARGV[4i], ARGV[4i+1], ARGV[4i+2], ARGV[4i+3] =
--   user, score after service, meta join field of the band, band join score after service
-- The ready entry carries the payload (moved out of the job hash), so a worker can call
-- the engine as soon as it reads the entry; the entry is deleted when the job ends.
-- Returns one job id per pick, or '' where the user's queue turned out empty.
local t = redis.call('TIME')
local now_ms = t[1] * 1000 + math.floor(t[2] / 1000)
local out = {}
local n = (#KEYS - 3) / 2
for i = 1, n do
  local backlog, queue = KEYS[2 + 2 * i], KEYS[3 + 2 * i]
  local user, score = ARGV[4 * i], ARGV[4 * i + 1]
  local head = redis.call('XRANGE', queue, '-', '+', 'COUNT', 1)
  out[i] = ''
  if #head > 0 then
    local job_id = head[1][2][2]
    redis.call('XDEL', queue, head[1][1])
    local job = ARGV[2] .. job_id
    if redis.call('HGET', job, 'st') == 'queued' then
      local f = redis.call('HMGET', job, 'p', 'k', 's')
      local entry = redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[3], '*',
        'j', job_id, 'ep', ARGV[1], 'p', f[1], 'k', f[2], 's', f[3])
      redis.call('HDEL', job, 'p')
      redis.call('HSET', job, 'st', 'dispatched', 'td', now_ms, 'ep', ARGV[1], 're', entry)
      redis.call('HINCRBY', KEYS[2], ARGV[1], 1)
      out[i] = job_id
    end
    redis.call('HSET', KEYS[3], ARGV[4 * i + 2], ARGV[4 * i + 3])
  end
  if redis.call('XLEN', queue) == 0 then
    redis.call('DEL', queue)
    redis.call('ZREM', backlog, user)
  else
    redis.call('ZADD', backlog, 'XX', score, user)
  end
end
return out
