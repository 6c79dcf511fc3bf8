-- lease.lua: take, keep or give back one model's dispatcher lease (a TTL'd owner key).
-- One dispatcher owns a model at a time; the owner renews well within the lease, and a
-- dispatcher that dies loses the model when its lease lapses. Two owners for a moment
-- (a renewal that came too late) are harmless: dispatch.lua is atomic per job.
-- KEYS[1] owner key   fq:{m}:owner
-- ARGV[1] this dispatcher's id   ARGV[2] lease in ms
-- ARGV[3] 'acquire' (take it if free, or keep it), 'renew' (keep it only if still ours),
--         'release' (give it up if ours)
-- Returns 1 when this dispatcher owns the model afterwards, else 0.
local owner = redis.call('GET', KEYS[1])
if ARGV[3] == 'release' then
  if owner == ARGV[1] then
    redis.call('DEL', KEYS[1])
  end
  return 0
end
if owner == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if owner or ARGV[3] == 'renew' then
  return 0
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
