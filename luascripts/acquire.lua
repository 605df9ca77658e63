#!lua
-- uses: lib.lua
-- acquire: one admission attempt for a waiter (budget.Store.TryAcquire).
--
-- KEYS[1]  config hash
-- ARGV[3]  waiter id (becomes the lease id on a grant)
-- ARGV[4]  process channel suffix (where wake events for this waiter go)
-- ARGV[5]  class index 0..NCLASS-1
-- ARGV[6]  memory bytes
-- ARGV[7]  1 if the request opens a body, else 0
-- ARGV[8]  consumer (diagnostics)
-- ARGV[9]  lease and waiter TTL, ms
-- ARGV[10] 1 if this is the first call ever sent for this id, else 0: a
--          first call cannot find a lease or a waiter of its own, and
--          skips looking for them
-- ARGV[11] number of domains n, then ARGV[12..11+n] domain encodings
--          (sorted, distinct)
-- Returns:
--   {"1", age_us}      granted; age_us is how long ago (0 now; more when an
--                      earlier call or another script's handoff granted it)
--   {"2"}              queued: wait for a wake event
--   {"3", wait_us}     delayed: try again after wait_us (rate or pause)
--   {"-1", mem_limit}  never admissible: memory above the run's ceiling
--   {"-2"}             the budget is not registered (config missing)
-- While the budget is quarantined after a state loss, every call is delayed.
-- Capacity this call frees (a waiter leaving) is handed to the next heads
-- before it returns (lib.lua, done).

local id = id_arg(ARGV[3], 'waiter id')
local ch = id_arg(ARGV[4], 'process channel')
local class = int(ARGV[5], 'class', 0, NCLASS - 1)
local mem = int(ARGV[6], 'memory', 0, 9007199254740991)
local body = int(ARGV[7], 'body flag', 0, 1)
local consumer = ARGV[8]
local ttl = int(ARGV[9], 'lease ttl', 1, 86400000) * 1000
local first = int(ARGV[10], 'first-call flag', 0, 1)
local n = int(ARGV[11], 'domain count', 1, 10000)
if #ARGV ~= 11 + n then bad('domain count does not match the arguments') end
local encs = {}
for i = 1, n do encs[i] = enc_arg(ARGV[11 + i]) end
local req = {id = id, encs = encs, class = class, mem = mem, body = body, consumer = consumer, ch = ch, ttl = ttl}

local now = clock()
local lim = lims()
if not lim then return {'-2'} end
touch_cfg(now)
reclaim(now)
-- After a state loss, counts are not trusted until every live holder has
-- had one TTL to re-assert its leases.
if now < lim.qu then
  return done({'3', I(lim.qu - now)})
end

local granted_at = first == 0 and redis.call('HGET', P .. 'l:' .. id, 'g')
if granted_at then
  -- A retried call, or a handoff: the grant stands, and is not made twice.
  return done({'1', I(math.max(0, now - tonumber(granted_at)))})
end
local wk = P .. 'w:' .. id
if lim.mem > 0 and mem > lim.mem then
  remove_waiter(id)
  return done({'-1', I(lim.mem)})
end

local doms = {}
for i, e in ipairs(encs) do doms[i] = dload(e) end

local ticket = first == 0 and tonumber(redis.call('HGET', wk, 't'))
local joined = false -- queued by this call: its queues' TTLs are fresh
if not ticket then
  -- First call: with nobody ahead anywhere, admit without queueing.
  local empty = true
  for _, d in ipairs(doms) do
    if redis.call('EXISTS', d.q) == 1 then empty = false break end
  end
  if empty then
    local slot, memb, wait = check(req, doms, lim, now, math.huge)
    if not slot and not memb and wait == 0 then
      grant(req, doms, lim, now)
      return done({'1', '0'})
    end
  end
  ticket = redis.call('HINCRBY', CFG, 'seq', 1)
  for _, d in ipairs(doms) do
    redis.call('ZADD', d.q, I(ticket), id)
    redis.call('PEXPIRE', d.q, IDLE)
  end
  redis.call('HSET', wk, 't', I(ticket), 'ds', table.concat(encs, ' '), 'ch', ch,
    'cs', consumer, 'c', I(class), 'm', I(mem), 'b', I(body), 'at', I(now), 'ttl', I(ttl))
  joined = true
end
-- Every call is also the waiter's liveness beat.
deadline(P .. 'wexp', now + ttl, id)
redis.call('PEXPIRE', P .. 'wexp', IDLE)
redis.call('PEXPIRE', wk, IDLE)

for _, d in ipairs(doms) do
  if head(d.q) ~= id then
    if not joined then redis.call('PEXPIRE', d.q, IDLE) end
    return done({'2'})
  end
end

local r, wait = decide(req, doms, lim, now, ticket)
if r == 'granted' then return done({'1', '0'}) end
for _, d in ipairs(doms) do dsave(d, now, lim) end -- keep the refilled buckets
if r == 'wait' then return done({'3', I(wait)}) end
return done({'2'})
