-- first.lua: the job's first output reached its result stream; it no longer waits to start.
-- Exactly once per job (HSETNX), whichever of first.lua, complete.lua or cancel.lua
-- gets there first, so the endpoint's count of jobs without a first token stays exact.
-- KEYS[1] job hash        fq:{m}:job:{id}
-- KEYS[2] unstarted hash  fq:{m}:unstarted
-- ARGV[1] wake channel: the endpoint's queue estimate just fell, so admission may open
-- ARGV[2] the worker's time of the first output in ms, or '' (a job that has no first
--         token yet: its request reached the engine)
-- Returns 1 when this call took the job off the count, else 0.
-- A job Redis no longer has (lost with the last second before a crash) stays gone: HSETNX
-- would create a record of it with no state and no expiry. A job queued again (park.lua,
-- reroute.lua) is not marked by its earlier attempt's late write: its next attempt's count
-- would never fall.
-- The first-token time 'tf' is shown while the job runs (its record, GET /v1/jobs/{id}),
-- not only from its end (complete.lua). Set once: an attempt that goes on with an answer
-- taken back mid-way (park.lua, reclaim.lua) keeps the time its client first saw output.
local st = redis.call('HGET', KEYS[1], 'st')
if st ~= 'dispatched' and st ~= 'running' then
  return 0
end
if ARGV[2] ~= '' then
  redis.call('HSETNX', KEYS[1], 'tf', ARGV[2])
end
if redis.call('HSETNX', KEYS[1], 'ft', 1) == 0 then
  return 0
end
local endpoint = redis.call('HGET', KEYS[1], 'ep')
if endpoint then
  redis.call('HINCRBY', KEYS[2], endpoint, -1)
  redis.call('PUBLISH', ARGV[1], 'e')
end
return 1
