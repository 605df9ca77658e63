#!lua flags=allow-oom
-- uses: lib.lua
-- reset: an operator clears a domain's throttle state: factor back to 1, no
-- pause. Counts and the bucket's tokens stay. The head of the domain's queue
-- is woken, since it may have been waiting out the pause.
--
-- KEYS[1]  config hash
-- ARGV[1..3] the common arguments (lib.lua)
-- ARGV[4]  domain encoding
-- Returns {R_OK} when the domain had state, {R_NO_STATE} when it had none,
-- {R_UNREGISTERED} when the budget does not exist.

local enc = enc_arg(ARGV[4])
local now = clock()
local lim = lims()
if not lim then return {R_UNREGISTERED} end
touch_cfg(now)
reclaim(now)
local d = dload(enc)
if d.new then return {R_NO_STATE} end
d.th, d.wm, d.da, d.bs, d.pu = 0, 0, 0, 0, 0
if lim.rps == 0 then
  d.bk = 0
elseif d.ta > now then
  d.ta = now -- tokens stop being held back by the pause
end
local h = q_head(d)
dsave(d, now, lim)
if h then candidate(h) end
return done({R_OK})
