-- ratecheck.lua: one token-bucket decision for one group, shared by every
-- client that names the same key. Used by redisstore.NewRateCheck.
--
-- KEYS[1]  the group's bucket, a string "<tokens> <micros>": what the bucket
--          held at <micros>, a Redis TIME in microseconds since the epoch.
--          Missing means full. The key expires when the bucket would be full
--          again, so idle groups cost nothing.
-- ARGV[1]  refill rate in tokens per second: plain decimal digits with an
--          optional fraction ("200", "0.5", "0.00001"; no sign, exponent or
--          spaces), above 0 and at most 1e9.
-- ARGV[2]  burst, the bucket's size: a plain integer from 1 to 1e9, with
--          burst / rate (the time to refill from empty) at most 31536000 s.
--
-- Returns one of:
--   {1, 0}         allowed: one token spent.
--   {0, <micros>}  denied: nothing spent; <micros>, an integer >= 1, is how
--                  long until one whole token is there at this rate.
--   error reply "ERR ratecheck: <what>"
--                  wrong number of KEYS or ARGV, or an invalid ARGV; no key
--                  was read or written.
--
-- Needs Redis 5 or later (writes after TIME need effect replication, the
-- default since then). TIME is read once, at the top: from Redis 7.0 it
-- advances while a script runs. Every number from outside (ARGV, the stored
-- state) is checked before use: Lua's tonumber also takes " 5", "0x10",
-- "inf" and "nan", and a NaN compares false with everything, which would
-- admit. A stored value that does not parse is treated as an empty bucket
-- (deny, then refill from now) and overwritten: fail closed, then heal. A
-- stored time ahead of TIME earns nothing and is moved back to TIME.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])

if #KEYS ~= 1 or #ARGV ~= 2 then
  return redis.error_reply('ERR ratecheck: want 1 key and 2 arguments')
end

-- The anchored patterns admit plain decimals only, so tonumber never sees
-- "nan", "inf", hex, signs or spaces; the length caps keep the values far
-- from overflow. Exponents are refused too: the client sends plain decimals,
-- and not every Lua that runs this script (an embedded test server, say)
-- reads "1e-05". The checks are written out inline rather than as local
-- helper functions: this runs on every request, and closures cost time.
local rate, burst
if #ARGV[1] <= 40 and string.find(ARGV[1], '^%d+%.?%d*$') then
  rate = tonumber(ARGV[1])
end
if not (rate and rate > 0 and rate <= 1e9) then
  return redis.error_reply('ERR ratecheck: invalid rate')
end
if #ARGV[2] <= 10 and string.find(ARGV[2], '^%d+$') then
  burst = tonumber(ARGV[2])
end
if not (burst and burst >= 1 and burst <= 1e9) then
  return redis.error_reply('ERR ratecheck: invalid burst')
end
if not (burst / rate <= 31536000) then
  return redis.error_reply('ERR ratecheck: burst / rate above the refill limit')
end

local key = KEYS[1]
local tokens = burst
local heal = false
local state = redis.call('GET', key)
if state then
  -- One anchored match checks the whole value: two plain decimals, the
  -- second an integer.
  local stored, at
  if #state <= 64 then
    local a, b = string.match(state, '^(%d+%.?%d*) (%d+)$')
    stored, at = tonumber(a), tonumber(b)
  end
  if not (stored and at and stored <= 1e9) then
    tokens = 0
    heal = true
  else
    local elapsed = now - at
    if elapsed < 0 then
      -- The stored time is ahead of this server's clock (a failover to a
      -- node whose clock lags): credit nothing rather than go negative, and
      -- restamp the bucket with this clock so that refill resumes from now
      -- instead of waiting for the clock to catch up.
      elapsed = 0
      heal = true
    end
    tokens = stored + elapsed * rate / 1000000
    if tokens > burst then
      tokens = burst
    end
  end
end

local allowed = tokens >= 1
if allowed then
  tokens = tokens - 1
end
-- A denial leaves a sound bucket as it was: its TTL still marks when it is
-- full again. A bucket that needed healing is written either way.
if allowed or heal then
  local ttl = math.ceil((burst - tokens) / rate * 1000)
  if ttl < 1 then
    ttl = 1
  end
  redis.call('SET', key, string.format('%.17f %.0f', tokens, now), 'PX', ttl)
end
if allowed then
  return {1, 0}
end
local wait = math.ceil((1 - tokens) / rate * 1000000)
if wait < 1 then
  wait = 1
end
return {0, wait}
