#!lua flags=allow-oom
-- uses: lib.lua
-- usage: a consistent snapshot of the budget.
--
-- KEYS[1]  config hash
-- ARGV[1..3] the common arguments (lib.lua)
-- Returns {R_OK, waiters, then per domain with anything held,
-- queued, throttled or paused: enc, f0 .. f<NCLASS-1> (in flight by class
-- index), bodies, factor, pause_us, queue length}, all strings, or
-- {R_UNREGISTERED} when the budget is not registered.

local now = clock()
local lim = lims()
if not lim then return {R_UNREGISTERED} end
touch_cfg(now)
reclaim(now)
local out, waiters = {R_OK, '0'}, 0
local doms = P .. 'doms'
for _, enc in ipairs(redis.call('ZRANGE', doms, 0, -1)) do
  local d = dload(enc)
  if d.new then
    redis.call('ZREM', doms, enc)
  else
    local f = factor(d, now)
    local pu = math.max(0, d.pu - now)
    local ql = d.nw
    -- A waiter on several domains counts once, in its first.
    waiters = waiters + d.nw - d.ns
    local held = d.b + ql
    for c = 1, NCLASS do held = held + d.f[c] end
    if held > 0 or f < 1 or pu > 0 then
      out[#out + 1] = enc
      for c = 1, NCLASS do out[#out + 1] = I(d.f[c]) end
      for _, x in ipairs({I(d.b), F(f), I(pu), I(ql)}) do out[#out + 1] = x end
    end
  end
end
out[2] = I(waiters)
return done(out)
