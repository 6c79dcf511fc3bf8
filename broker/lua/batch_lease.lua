-- batch_lease.lua: renew or release the lease on a batch, only by the job that holds it.
-- (It is taken with a plain SET NX PX by the batch worker's sweep.)
-- KEYS[1] lease   fq:batch:{id}:lease
-- ARGV[1] the holder's token   ARGV[2] new lease in ms, or 0 to release it
-- Returns 1 when the caller holds (held) the lease, 0 when it has lost it.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
if tonumber(ARGV[2]) > 0 then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
else
  redis.call('DEL', KEYS[1])
end
return 1
