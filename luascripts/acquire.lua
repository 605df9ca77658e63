#!lua
-- uses: lib.lua
-- acquire: one admission attempt for a waiter (budget.Store.TryAcquire).
--
-- KEYS[1]  config hash
-- ARGV[1..3] the common arguments (lib.lua)
-- ARGV[4]  waiter id (becomes the lease id on a grant)
-- ARGV[5]  process channel suffix (where wake events for this waiter go)
-- ARGV[6]  class index 0..NCLASS-1
-- ARGV[7]  1 if the request opens a body, else 0
-- ARGV[8]  consumer (diagnostics)
-- ARGV[9]  lease and waiter TTL, ms
-- ARGV[10] number of domains n, then ARGV[11..10+n] domain encodings
--          (sorted, distinct)
-- Every call looks for a lease and a waiter of its own id, even the first
-- the client sends: go-redis resends a call whose reply timed out, and a
-- call that skipped the look would grant the same id twice (fault 12).
-- Memory is not an argument: each host's Budget keeps its own memory line.
-- Returns:
--   {R_GRANTED, age_us}  granted; age_us is how long ago (0 now; more when
--                        an earlier call or another script's handoff
--                        granted it)
--   {R_QUEUED}           queued: wait for a wake event
--   {R_DELAYED, wait_us} delayed: try again after wait_us (rate or pause)
--   {R_UNREGISTERED}     the budget is not registered (config missing)
-- While the budget is quarantined after a state loss, every call is delayed.
-- Capacity this call frees (a waiter leaving) is handed to the next heads
-- before it returns (lib.lua, done).

local id = id_arg(ARGV[4], 'waiter id')
local ch = id_arg(ARGV[5], 'process channel')
local class = int(ARGV[6], 'class', 0, NCLASS - 1)
local body = int(ARGV[7], 'body flag', 0, 1)
local consumer = ARGV[8]
local ttl = int(ARGV[9], 'lease ttl', 1, 86400000) * 1000
local n = int(ARGV[10], 'domain count', 1, 10000)
if #ARGV ~= 10 + n then bad('domain count does not match the arguments') end
local encs = {}
for i = 1, n do encs[i] = enc_arg(ARGV[10 + i]) end
local req = {id = id, encs = encs, class = class, body = body, consumer = consumer, ch = ch, ttl = ttl}

local now = clock()
local lim = lims()
if not lim then return {R_UNREGISTERED} end
touch_cfg(now)
reclaim(now)
-- After a state loss, counts are not trusted until every live holder has
-- had one TTL to re-assert its leases.
if now < lim.qu then
  return done({R_DELAYED, I(lim.qu - now)})
end

local granted_at = redis.call('HGET', P .. 'l:' .. id, 'g')
if granted_at then
  -- A retried call, or a handoff: the grant stands, and is not made twice.
  return done({R_GRANTED, I(math.max(0, now - tonumber(granted_at)))})
end
local wk = P .. 'w:' .. id

local doms = {}
for i, e in ipairs(encs) do doms[i] = dload(e) end

local ticket = tonumber(redis.call('HGET', wk, 't'))
local joined = false -- queued by this call: its queues' TTLs are fresh
if not ticket then
  -- First call: with nobody ahead anywhere, admit without queueing.
  local empty = true
  for _, d in ipairs(doms) do
    if redis.call('EXISTS', d.q) == 1 then empty = false break end
  end
  if empty then
    local slot, wait = check(req, doms, lim, now)
    if not slot and wait == 0 then
      grant(req, doms, lim, now)
      return done({R_GRANTED, '0'})
    end
  end
  ticket = redis.call('HINCRBY', CFG, 'seq', 1)
  for _, d in ipairs(doms) do
    redis.call('ZADD', d.q, I(ticket), id)
    redis.call('PEXPIRE', d.q, IDLE)
  end
  redis.call('HSET', wk, 't', I(ticket), 'ds', table.concat(encs, ' '), 'ch', ch,
    'cs', consumer, 'c', I(class), 'b', I(body), 'at', I(now), 'ttl', I(ttl))
  joined = true
end
-- Every call is also the waiter's liveness beat.
deadline(P .. 'wexp', now + ttl, id)
redis.call('PEXPIRE', P .. 'wexp', IDLE)
redis.call('PEXPIRE', wk, IDLE)

for _, d in ipairs(doms) do
  if head(d.q) ~= id then
    if not joined then redis.call('PEXPIRE', d.q, IDLE) end
    if joined then
      -- Usage lists the domains in doms, where dsave puts them: a domain
      -- first met by this waiter, queued behind others elsewhere, must be
      -- saved too, or its queue would not show.
      for _, e in ipairs(doms) do
        if e.rx == 0 then dsave(e, now, lim) end
      end
    end
    return done({R_QUEUED})
  end
end

local r, wait = decide(req, doms, lim, now)
if r == 'granted' then return done({R_GRANTED, '0'}) end
for _, d in ipairs(doms) do dsave(d, now, lim) end -- keep the refilled buckets
if r == 'wait' then return done({R_DELAYED, I(wait)}) end
return done({R_QUEUED})
