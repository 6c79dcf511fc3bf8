-- unseen.lua: how many of a model's jobs an endpoint's metrics cannot show yet, read
-- just before the dispatcher scrapes it: jobs on their way (state 'dispatched', in the
-- transit hash) plus jobs handed to the engine within the engine's metrics lag (vLLM
-- updates its gauges once per engine step), from the handed zset start.lua keeps.
-- KEYS[1] transit hash   fq:{m}:transit
-- KEYS[2] handed zset    fq:{m}:handed ("endpoint\njob id" -> when it started, ms)
-- ARGV[1] endpoint   ARGV[2] the metrics lag in ms
-- Returns the count.
local t = redis.call('TIME')
local now_ms = t[1] * 1000 + math.floor(t[2] / 1000)
local count = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '0')
local prefix = ARGV[1] .. '\n'
for _, member in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], now_ms - tonumber(ARGV[2]), '+inf')) do
  if string.sub(member, 1, #prefix) == prefix then
    count = count + 1
  end
end
return count
