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
local out = {R_OK, I(redis.call('ZCARD', P .. 'wexp'))}
local doms = P .. 'doms'
for _, enc in ipairs(redis.call('ZRANGE', doms, 0, -1)) do
  if redis.call('EXISTS', P .. 'd:' .. enc) == 0 then
    redis.call('ZREM', doms, enc)
  else
    local d = dload(enc)
    local f = factor(d, now)
    local pu = math.max(0, d.pu - now)
    local ql = redis.call('ZCARD', d.q)
    local held = d.b + ql
    for _, fc in ipairs(CLASSF) do held = held + d[fc] end
    if held > 0 or f < 1 or pu > 0 then
      local row = {enc}
      for _, fc in ipairs(CLASSF) do row[#row + 1] = I(d[fc]) end
      for _, x in ipairs({I(d.b), F(f), I(pu), I(ql)}) do row[#row + 1] = x end
      for _, x in ipairs(row) do out[#out + 1] = x end
    end
  end
end
return done(out)
