#!lua
-- uses: lib.lua
-- throttle: the provider throttled a request on one domain. One
-- multiplicative decrease per congestion event (reports inside the
-- coalescing window or the pause are the same event), and an optional pause.
-- Mirrors memStore.Throttle in budget/memstore.go.
--
-- KEYS[1]  config hash
-- ARGV[1..3] the common arguments (lib.lua)
-- ARGV[4]  domain encoding
-- ARGV[5]  retry-after, us (0: unknown)
-- ARGV[6]  quarantine after a detected restart, ms (the caller's lease TTL)
-- Returns {R_OK, factor after the report}, or {R_UNREGISTERED} when the
-- budget is not registered.

local enc = enc_arg(ARGV[4])
local pause = int(ARGV[5], 'retry-after', 0, 9007199254740991)
local now = clock()
local lim = lims()
if not lim then return {R_UNREGISTERED} end
if restarted() then new_epoch(now, int(ARGV[6], 'quarantine', 0, 86400000) * 1000) end
touch_cfg(now)
reclaim(now)

local d = dload(enc)
settle(d, now, lim)
local r, burst = rate(d, now, lim)
if r > 0 then refill(d, now, r, burst) end
local window_end = math.max(d.da + WINDOW, d.pu)
if d.th ~= 1 or now >= window_end then
  if d.th ~= 1 and lim.rps == 0 then
    d.bs = MIN_BASE
    -- No start within START_MEMORY: no history to measure (see grant).
    if d.fs ~= 0 and now - d.sa < START_MEMORY then d.bs = math.max(MIN_BASE, measured(d, now)) end
  end
  d.wm = factor(d, now)
  d.da = now
  d.th = 1
  d.bk, d.tk, d.ta = 1, 0, now
end
if pause > 0 then
  if now + pause > d.pu then d.pu = now + pause end
  if d.tk > 0 then d.tk = 0 end
  if d.pu > d.ta then d.ta = d.pu end
end
dsave(d, now, lim)
return done({R_OK, F(factor(d, now))})
