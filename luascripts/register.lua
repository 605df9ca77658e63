#!lua
-- uses: lib.lua
-- register: store a budget's limits, or check them against the stored ones.
--
-- KEYS[1]  config hash
-- ARGV[3]  limits as canonical JSON (compared byte for byte)
-- ARGV[4]  requests per second (decimal), ARGV[5] burst,
-- ARGV[6]  open bodies, ARGV[7] memory bytes
-- ARGV[8]  1 to replace differing stored limits, else 0
-- ARGV[9]  1 when this host held state under an earlier epoch that is gone
--          (Redis lost the budget): new grants then wait ARGV[10] ms, long
--          enough for every live holder to re-assert its leases.
-- ARGV[10] quarantine, ms
-- ARGV[11] 1 to start a new epoch even though the config exists (Redis
--          restarted from a persistence file that may miss recent writes)
-- ARGV[12..11+NCLASS] in-flight ceilings by class index
-- Replacing limits wakes the head of every queue, which re-checks under them.
-- Returns:
--   {"1", epoch}            registered (or identical limits already stored)
--   {"-3", stored_json}     different limits are stored and replace is 0

local json = ARGV[3]
local rps = dec(ARGV[4], 'rate', 1e9)
local burst = int(ARGV[5], 'burst', 0, 9007199254740991)
local bodies = int(ARGV[6], 'open bodies', 0, 9007199254740991)
local mem = int(ARGV[7], 'memory', 0, 9007199254740991)
local replace = int(ARGV[8], 'replace flag', 0, 1)
local lost = int(ARGV[9], 'lost flag', 0, 1)
local quarantine = int(ARGV[10], 'quarantine', 0, 86400000) * 1000
local renew = int(ARGV[11], 'new epoch flag', 0, 1)
if #ARGV ~= 11 + NCLASS then bad('expected ' .. NCLASS .. ' in-flight ceilings') end
local fields = {'json', json, 'rps', ARGV[4], 'burst', I(burst), 'bodies', I(bodies), 'mem', I(mem)}
for c = 1, NCLASS do
  fields[#fields + 1] = CAPF[c]
  fields[#fields + 1] = I(int(ARGV[11 + c], 'in-flight ceiling', 0, 9007199254740991))
end

local now = clock()
local stored = redis.call('HGET', CFG, 'json')
if stored and stored ~= json and replace == 0 then
  touch_cfg(now)
  return {'-3', stored}
end
redis.call('HSET', CFG, unpack(fields))
if stored and (renew == 1 or restarted()) then
  -- Same data, but some of it may be older than the holders' view: a new
  -- epoch makes every host re-assert, under quarantine.
  new_epoch(now, quarantine)
elseif not stored then
  restarted() -- note the run_id that writes this budget
end
if lost == 1 and not stored then
  redis.call('HSET', CFG, 'qu', I(now + quarantine))
end
redis.call('HSETNX', CFG, 'epoch', I(now))
redis.call('HSETNX', CFG, 'seq', 0)
redis.call('HSETNX', CFG, 'memheld', 0)
touch_cfg(now)
reclaim(now)
if stored and stored ~= json then
  -- New ceilings may let waiters move: wake every queue's head and the
  -- first of the memory line; they re-check under the new limits.
  for _, enc in ipairs(redis.call('ZRANGE', P .. 'doms', 0, -1)) do
    local h = head(P .. 'q:' .. enc)
    if h then candidate(h) end
  end
  local f = head(P .. 'memq')
  if f then candidate(f) end
end
return done({'1', redis.call('HGET', CFG, 'epoch')})
