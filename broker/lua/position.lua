-- position.lua: how many jobs of its user's queue are ahead of a queued job.
-- Counted here, not by a reader outside Redis: queue entries carry the payloads, which it
-- would have to receive only to count them. Pages are small for the same reason.
-- KEYS[1] job hash            fq:{m}:job:{id}
-- KEYS[2] user queue stream   fq:{m}:q:{band}:{user}  (the job's own band and user)
-- ARGV[1] most entries to count (a bound on the work of one call)
-- Returns the number of entries before the job's entry ('qe'), or -1 when it is not queued.
local f = redis.call('HMGET', KEYS[1], 'st', 'qe')
if f[1] ~= 'queued' or not f[2] then
  return -1
end
local PAGE = 100
local limit = tonumber(ARGV[1])
local ahead, from = 0, '-'
while ahead < limit do
  local page = redis.call('XRANGE', KEYS[2], from, '(' .. f[2], 'COUNT', PAGE)
  ahead = ahead + #page
  if #page < PAGE then
    break
  end
  from = '(' .. page[#page][1]
end
return math.min(ahead, limit)
