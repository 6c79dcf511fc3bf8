-- renew.lua: renew this worker's lease on every ready entry it holds for one model, in one
-- call per renewal interval, and report the entries it no longer holds.
-- The lease is the entry's idle time in the consumer group: XCLAIM ... JUSTID resets it to
-- 0 and leaves the delivery count alone. Only entries this worker still owns are renewed:
-- a bare XCLAIM would take an entry back from a worker that reclaimed it after this one's
-- lease lapsed (a long pause), and the job would then run twice.
-- KEYS[1] ready stream   fq:{m}:ready
-- ARGV[1] ready consumer group   ARGV[2] this worker (consumer name)
-- ARGV[3 ..] the entry ids this worker holds
-- Returns the ids among them that this worker has lost (the worker must drop those jobs
-- without writing anything more: another worker owns them, or they have ended).
local mine, lost = {}, {}
for i = 3, #ARGV do
  local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[i], ARGV[i], 1)
  if #p == 1 and p[1][2] == ARGV[2] then
    mine[#mine + 1] = ARGV[i]
  else
    lost[#lost + 1] = ARGV[i]
  end
end
if #mine > 0 then
  mine[#mine + 1] = 'JUSTID'
  redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, unpack(mine))
end
return lost
