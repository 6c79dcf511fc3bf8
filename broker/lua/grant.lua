-- grant.lua: set (or revoke) a model's express grant: how many new jobs of each band
-- enqueue.lua may send straight to one endpoint, until an expiry.
-- A grant is the dispatcher's admission decision made ahead of the jobs. It is refused
-- when it may be out of date: when an express send or a dispatch happened since the state
-- it was computed from (they bump 'xs'). A revocation (endpoint '') always applies.
-- Queued jobs need no check here: enqueue.lua sends express only while nothing of the
-- job's band or a more urgent one is queued.
-- KEYS[1] meta hash   fq:{m}:meta ('xep' endpoint, 'xexp' expiry ms, 'xs' sequence)
-- ARGV[1] the sequence ('xs') of the state the grant was computed from
-- ARGV[2] time to live in ms   ARGV[3] endpoint, or '' to revoke
-- ARGV[4] sends left to users who already have a job in the engine ('xsv'; -1: no bound)
-- ARGV[5 ..] pairs: a band's credit field ("xn:{band}"), its credits
-- Returns 1 when the grant was written, 0 when it was refused.
local function set_credits(keep)
  for i = 5, #ARGV, 2 do
    redis.call('HSET', KEYS[1], ARGV[i], keep and ARGV[i + 1] or 0)
  end
end

if ARGV[3] == '' then
  redis.call('HDEL', KEYS[1], 'xep', 'xexp', 'xsv')
  set_credits(false)
  return 1
end
if (redis.call('HGET', KEYS[1], 'xs') or '0') ~= ARGV[1] then
  return 0
end
local now = now_ms()
redis.call('HSET', KEYS[1], 'xep', ARGV[3], 'xexp', now + tonumber(ARGV[2]), 'xsv', ARGV[4])
set_credits(true)
return 1
