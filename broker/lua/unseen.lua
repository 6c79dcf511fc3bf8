-- unseen.lua: how many of a model's jobs an endpoint's metrics cannot show yet, read
-- just before the dispatcher scrapes it: jobs on their way (state 'dispatched', in the
-- transit hash) plus jobs handed to the engine within the engine's metrics lag (vLLM
-- updates its gauges once per engine step), from the handed zset start.lua keeps.
-- A handed streamed job waits in the engine only until its first token, which fairq sees
-- at once (the unstarted count), so those are counted apart, and not at all once they
-- have one ('ft'); a handed job whose record is gone has ended.
-- KEYS[1] transit hash   fq:{m}:transit
-- KEYS[2] handed zset    fq:{m}:handed ("endpoint\njob id" -> when it started, ms)
-- KEYS[3] unstarted hash fq:{m}:unstarted (endpoint -> jobs without a first token)
-- KEYS[4] inflight hash  fq:{m}:inflight (endpoint -> jobs dispatched and not ended)
-- ARGV[1] endpoint   ARGV[2] the metrics lag in ms   ARGV[3] job key prefix fq:{m}:job:
-- ARGV[4] the start window in ms: a streamed job handed over within it and without a
-- first token is starting (in the step that takes it in, or its prefill), not waiting
-- Returns {jobs that may wait until a scrape shows them, handed streamed jobs without a
-- first token, every job sent to the endpoint without a first token, handed streamed
-- jobs starting, jobs in flight there that the metrics can show}: of what the scrape
-- finds waiting, the third are fairq's own, which it counts without lag, and the fourth
-- may be waiting only for the engine's next step. The last (in flight, less those on
-- their way and those handed over within the lag) bounds fairq's share of the engine's
-- queue from below once it exceeds the running set: an engine that put started jobs
-- back in its queue (KV cache full) waits with them.
local now = now_ms()
local lag = tonumber(ARGV[2])
local window = math.max(lag, tonumber(ARGV[4] or '0'))  -- the zset keeps a second
local held = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '0')
local shown = tonumber(redis.call('HGET', KEYS[4], ARGV[1]) or '0') - held
local streamed, starting = 0, 0
local prefix = ARGV[1] .. '\n'
local members = redis.call('ZRANGEBYSCORE', KEYS[2], now - window, '+inf', 'WITHSCORES')
for i = 1, #members, 2 do
  local member = members[i]
  if string.sub(member, 1, #prefix) == prefix then
    local recent = tonumber(members[i + 1]) >= now - lag
    if recent then shown = shown - 1 end
    local f = redis.call('HMGET', ARGV[3] .. string.sub(member, #prefix + 1), 's', 'ft')
    if f[1] == '0' then
      if recent then held = held + 1 end
    elseif f[1] and not f[2] then
      starting = starting + 1
      if recent then streamed = streamed + 1 end
    end
  end
end
local unstarted = tonumber(redis.call('HGET', KEYS[3], ARGV[1]) or '0')
return {held, streamed, unstarted, starting, math.max(0, shown)}
