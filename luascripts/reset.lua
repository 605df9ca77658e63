#!lua flags=allow-oom
-- uses: lib.lua
-- reset: an operator clears a domain's throttle state: factor back to 1, no
-- pause. Counts and the bucket's tokens stay. The head of the domain's queue
-- is woken, since it may have been waiting out the pause.
--
-- KEYS[1]  config hash
-- ARGV[3]  domain encoding
-- Returns {"1"} when the domain had state, {"0"} when it had none, {"-2"}
-- when the budget does not exist.

local enc = enc_arg(ARGV[3])
local now = clock()
local lim = lims()
if not lim then return {'-2'} end
touch_cfg(now)
reclaim(now)
if redis.call('EXISTS', P .. 'd:' .. enc) == 0 then return {'0'} end
local d = dload(enc)
d.th, d.wm, d.da, d.bs, d.pu = 0, 0, 0, 0, 0
if lim.rps == 0 then
  d.bk = 0
elseif d.ta > now then
  d.ta = now -- tokens stop being held back by the pause
end
dsave(d, now, lim)
local h = head(d.q)
if h then candidate(h) end
return done({'1'})
