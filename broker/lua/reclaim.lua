-- reclaim.lua: take over the ready entries of dead workers (idle longer than the lease) and
-- decide each job's fate, atomically, so two workers reclaiming at once never share a job.
-- KEYS[1] ready stream     fq:{m}:ready
-- KEYS[2] unstarted hash   fq:{m}:unstarted
-- KEYS[3] transit hash     fq:{m}:transit (a job's move between 'dispatched' and
--                          'running' moves it in or out of this count)
-- ARGV[1] ready consumer group   ARGV[2] this worker (consumer name)   ARGV[3] lease in ms
-- ARGV[4] most entries to take   ARGV[5] job key prefix (fq:{m}:job:)
-- ARGV[6] result key prefix (fq:{m}:out:)   ARGV[7] attempts allowed per job
-- Per entry taken (it is now pending under this worker, whose lease renewals cover it):
--   the job ended already, or is gone: the entry is acknowledged and deleted; not returned
--   'fail'  output reached its result stream already (a fence park.lua added is none): a
--           retry would repeat text, so this worker must end it failed (the job is marked
--           running under this worker)
--   'dead'  it was started the allowed number of times: this worker must end it as a dead
--           letter (marked running under this worker)
--   'retry' it is dispatched again, for this worker to run after a backoff (start.lua
--           counts the attempt); its first-token mark is undone, so the endpoint's count
--           of jobs without a first token stays exact
-- Returns {decision, entry id, attempts, {entry field, value, ...}} per entry returned.
local claimed = redis.call('XAUTOCLAIM', KEYS[1], ARGV[1], ARGV[2], ARGV[3], '0-0',
  'COUNT', ARGV[4])
local out = {}
for _, e in ipairs(claimed[2]) do
  local id, fields = e[1], e[2]
  local job_id = nil
  if type(fields) == 'table' then
    for i = 1, #fields, 2 do
      if fields[i] == 'j' then job_id = fields[i + 1] end
    end
  end
  local f = {false, '0', false, false, false}
  if job_id then
    f = redis.call('HMGET', ARGV[5] .. job_id, 'st', 'att', 'ft', 'ep', 'pk')
  end
  local st, attempts = f[1], tonumber(f[2] or '0')
  local job = job_id and ARGV[5] .. job_id
  local decision = 'retry'
  if st ~= 'dispatched' and st ~= 'running' then
    decision = nil
  elseif first_output(ARGV[6] .. job_id, f[5]) then
    decision = 'fail'
  elseif attempts >= tonumber(ARGV[7]) then
    decision = 'dead'
  end
  if not decision then
    drop_entry(KEYS[1], ARGV[1], id)
  elseif decision ~= 'retry' then
    if st == 'dispatched' and f[4] then redis.call('HINCRBY', KEYS[3], f[4], -1) end
    redis.call('HSET', job, 'st', 'running', 'wk', ARGV[2])
    out[#out + 1] = {decision, id, attempts, fields}
  else
    if st == 'running' and f[4] then redis.call('HINCRBY', KEYS[3], f[4], 1) end
    redis.call('HSET', job, 'st', 'dispatched')
    redis.call('HDEL', job, 'wk')
    if f[3] and f[4] then
      redis.call('HDEL', job, 'ft')
      redis.call('HINCRBY', KEYS[2], f[4], 1)
    end
    out[#out + 1] = {'retry', id, attempts, fields}
  end
end
return out
