#!lua
-- uses: lib.lua
-- register: store a budget's limits, or check them against the stored ones.
--
-- KEYS[1]  config hash
-- ARGV[3]  limits as canonical JSON (compared byte for byte)
-- ARGV[4]  requests per second (decimal), ARGV[5] burst,
-- ARGV[6..9] in-flight ceilings by class index, ARGV[10] open bodies,
-- ARGV[11] memory bytes
-- ARGV[12] 1 to replace differing stored limits, else 0
-- ARGV[13] 1 when this host held state under an earlier epoch that is gone
--          (Redis lost the budget): new grants then wait ARGV[14] ms, long
--          enough for every live holder to re-assert its leases.
-- ARGV[14] quarantine, ms
-- ARGV[15] 1 to start a new epoch even though the config exists (Redis
--          restarted from a persistence file that may miss recent writes)
-- Replacing limits wakes the head of every queue, which re-checks under them.
-- Returns:
--   {"1", epoch}            registered (or identical limits already stored)
--   {"-3", stored_json}     different limits are stored and replace is 0

local json = ARGV[3]
local rps = dec(ARGV[4], 'rate', 1e9)
local burst = int(ARGV[5], 'burst', 0, 9007199254740991)
local caps = {}
for i = 0, 3 do caps[i] = int(ARGV[6 + i], 'in-flight ceiling', 0, 9007199254740991) end
local bodies = int(ARGV[10], 'open bodies', 0, 9007199254740991)
local mem = int(ARGV[11], 'memory', 0, 9007199254740991)
local replace = int(ARGV[12], 'replace flag', 0, 1)
local lost = int(ARGV[13], 'lost flag', 0, 1)
local quarantine = int(ARGV[14], 'quarantine', 0, 86400000) * 1000
local renew = int(ARGV[15], 'new epoch flag', 0, 1)

local now = clock()
local stored = redis.call('HGET', CFG, 'json')
if stored and stored ~= json and replace == 0 then
  touch_cfg(now)
  return {'-3', stored}
end
redis.call('HSET', CFG, 'json', json, 'rps', ARGV[4], 'burst', I(burst),
  'c0', I(caps[0]), 'c1', I(caps[1]), 'c2', I(caps[2]), 'c3', I(caps[3]), 'bodies', I(bodies), 'mem', I(mem))
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
