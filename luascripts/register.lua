#!lua
-- uses: lib.lua
-- register: store a budget's limits, or check them against the stored ones.
--
-- KEYS[1]  config hash
-- ARGV[1..3] the common arguments (lib.lua)
-- ARGV[4]  limits as canonical JSON (compared byte for byte), the layout
--          first (lib.lua, convert_layout)
-- ARGV[5]  requests per second (decimal), ARGV[6] burst,
-- ARGV[7]  open bodies (memory is each host's own, never stored here)
-- ARGV[8]  1 to replace differing stored limits, else 0
-- ARGV[9]  1 when this host held state under an earlier epoch that is gone
--          (Redis lost the budget): new grants then wait ARGV[10] ms, long
--          enough for every live holder to re-assert its leases.
-- ARGV[10] quarantine, ms: the host's lease TTL (the config keeps the
--          longest one registered, for the group clock: lib.lua)
-- ARGV[11] 1 to start a new epoch even though the config exists (Redis
--          restarted from a persistence file that may miss recent writes)
-- ARGV[12..11+NCLASS] in-flight ceilings by class index
-- Replacing limits first brings every bucket up to now under the old ones,
-- then tries the head of every queue again under the new (a handoff).
-- Returns:
--   {R_OK, epoch}               registered (or identical limits already stored)
--   {R_CONFLICT, stored_json}   different limits are stored and replace is 0

local json = ARGV[4]
local rps = dec(ARGV[5], 'rate', 1e9)
local burst = int(ARGV[6], 'burst', 0, 9007199254740991)
local bodies = int(ARGV[7], 'open bodies', 0, 9007199254740991)
local replace = int(ARGV[8], 'replace flag', 0, 1)
local lost = int(ARGV[9], 'lost flag', 0, 1)
local quarantine = int(ARGV[10], 'quarantine', 0, 86400000) * 1000
local renew = int(ARGV[11], 'new epoch flag', 0, 1)
if #ARGV ~= 11 + NCLASS then bad('expected ' .. NCLASS .. ' in-flight ceilings') end
local fields = {'json', json, 'ly', I(LAYOUT), 'rps', ARGV[5], 'burst', I(burst), 'bodies', I(bodies)}
for c = 1, NCLASS do
  fields[#fields + 1] = CAPF[c]
  fields[#fields + 1] = I(int(ARGV[11 + c], 'in-flight ceiling', 0, 9007199254740991))
end

local now = clock()
local stored = redis.call('HGET', CFG, 'json')
if stored and stored ~= json and replace == 0 then
  touch_cfg(now)
  return {R_CONFLICT, stored}
end
local replacing = stored and stored ~= json
if replacing and lims() then
  -- Tokens earned so far were earned at the old rate: bring every bucket
  -- up to now under the limits being replaced, as a throttle does before
  -- it changes a domain's rate (memStore.Register does the same). Work in
  -- the number of domains, on a rare call.
  local old = lims()
  for _, enc in ipairs(redis.call('ZRANGE', P .. 'doms', 0, -1)) do
    local d = dload(enc)
    if not d.new then
      settle(d, now, old)
      local r, size = rate(d, now, old)
      if r > 0 then refill(d, now, r, size) end
      dsave(d, now, old)
    end
  end
end
redis.call('HSET', CFG, unpack(fields))
forget_limits()
if stored and (renew == 1 or restarted()) then
  -- Same data, but some of it may be older than the holders' view: a new
  -- epoch makes every host re-assert, under quarantine.
  new_epoch(now, quarantine)
elseif not stored then
  restarted() -- note the run_id that writes this budget
end
if not stored then
  -- A config made now vouches for no count: whatever a loss left behind
  -- (lease records, a domain's counts) is of no epoch it knows: the new
  -- ce puts the records out of reach (lib.lua, lxkey) and the counts read
  -- as zero (Clock jumps). Its group clock starts at TIME.
  cfg_put('epoch', now, 'ce', now, 'lt', now, 'co', 0)
  if lost == 1 then cfg_put('qu', now + quarantine) end
end
if quarantine > (tonumber(redis.call('HGET', CFG, 'tl')) or 0) then
  cfg_put('tl', quarantine)
end
redis.call('HSETNX', CFG, 'epoch', I(now))
touch_cfg(now)
reclaim(now)
if replacing then
  -- New ceilings may let waiters move: every queue's head is a candidate,
  -- oldest first (by arrival, as memStore.Register tries them; the order
  -- decides who gets capacity two heads both want). done() grants those
  -- that fit and wakes the rest that must hear of it.
  local heads, seen = {}, {}
  for _, enc in ipairs(redis.call('ZRANGE', P .. 'doms', 0, -1)) do
    local h = q_head(dload(enc))
    if h and not seen[h.id] then
      seen[h.id] = true
      heads[#heads + 1] = {h.at, h}
    end
  end
  table.sort(heads, function(a, b) return a[1] < b[1] end)
  for _, h in ipairs(heads) do candidate(h[2]) end
end
return done({R_OK, redis.call('HGET', CFG, 'epoch')})
