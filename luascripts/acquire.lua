#!lua
-- uses: lib.lua
-- acquire: one admission attempt for a waiter (budget.Store.TryAcquire).
--
-- KEYS[1]  config hash
-- ARGV[3]  waiter id (becomes the lease id on a grant)
-- ARGV[4]  process channel suffix (where wake events for this waiter go)
-- ARGV[5]  class index 0..3
-- ARGV[6]  memory bytes
-- ARGV[7]  1 if the request opens a body, else 0
-- ARGV[8]  consumer (diagnostics)
-- ARGV[9]  lease and waiter TTL, ms
-- ARGV[10] number of domains n, then ARGV[11..10+n] domain encodings
--          (sorted, distinct)
-- Returns:
--   {"1"}              granted (also when this id was granted before)
--   {"2"}              queued: wait for a wake event
--   {"3", wait_us}     delayed: try again after wait_us (rate or pause)
--   {"-1", mem_limit}  never admissible: memory above the run's ceiling
--   {"-2"}             the budget is not registered (config missing)
-- While the budget is quarantined after a state loss, every call is delayed.

local id = id_arg(ARGV[3], 'waiter id')
local ch = id_arg(ARGV[4], 'process channel')
local class = int(ARGV[5], 'class', 0, 3)
local mem = int(ARGV[6], 'memory', 0, 9007199254740991)
local body = int(ARGV[7], 'body flag', 0, 1)
local consumer = ARGV[8]
local ttl = int(ARGV[9], 'lease ttl', 1, 86400000) * 1000
local n = int(ARGV[10], 'domain count', 1, 10000)
if #ARGV ~= 10 + n then bad('domain count does not match the arguments') end
local encs = {}
for i = 1, n do encs[i] = enc_arg(ARGV[10 + i]) end

local now = clock()
local lim = limits()
if not lim then return {'-2'} end
touch_cfg()
reclaim(now)
-- After a state loss, counts are not trusted until every live holder has
-- had one TTL to re-assert its leases.
local qu = tonumber(redis.call('HGET', CFG, 'qu'))
if qu and now < qu then
  return {'3', I(qu - now)}
end

local lk = P .. 'l:' .. id
if redis.call('EXISTS', lk) == 1 then
  return {'1'} -- a retried call: the grant stands, and is not made twice
end
local wk = P .. 'w:' .. id
if lim.mem > 0 and mem > lim.mem then
  remove_waiter(id)
  return {'-1', I(lim.mem)}
end

-- Reports, without changing counts, whether the request fits now. Buckets
-- are refilled (their only write). ticket orders this waiter against the
-- memory line; a new arrival is younger than everyone.
local function check(doms, ticket)
  local slot, memb, wait = false, false, 0
  local cap = lim.caps[class + 1]
  local fc = 'f' .. class
  for _, d in ipairs(doms) do
    settle(d, now, lim)
    if now < d.pu then wait = math.max(wait, d.pu - now) end
    if cap > 0 and d[fc] >= cap then slot = true end
    if body == 1 and lim.bodies > 0 and d.b >= lim.bodies then slot = true end
    local r, burst = rate(d, now, lim)
    if r > 0 then
      refill(d, now, r, burst)
      if d.tk < 1 then
        wait = math.max(wait, math.ceil((1 - d.tk) / r * 1000000))
      end
    end
  end
  if mem > 0 and lim.mem > 0 then
    if lim.memheld + mem > lim.mem then
      memb = true
    else
      local first = redis.call('ZRANGE', P .. 'memq', 0, 0, 'WITHSCORES')
      if first[1] and tonumber(first[2]) < ticket then memb = true end
    end
  end
  return slot, memb, wait
end

local function grant(doms)
  local fc = 'f' .. class
  for _, d in ipairs(doms) do
    d[fc] = d[fc] + 1
    if body == 1 then d.b = d.b + 1 end
    if d.bk == 1 then d.tk = d.tk - 1 end
    if d.fs == 0 then d.fs = now end
    d.ss = decay(d.ss, (now - d.sa) / 1000000) + 1 / TAU
    d.sa = now
    dsave(d, now, lim)
  end
  if mem > 0 then redis.call('HINCRBY', CFG, 'memheld', I(mem)) end
  redis.call('HSET', lk, 'ds', table.concat(encs, ' '), 'c', I(class), 'm', I(mem),
    'hr', '1', 'hb', I(body), 'hm', (mem > 0) and '1' or '0', 'cs', consumer, 'g', I(now), 'ch', ch)
  redis.call('PEXPIRE', lk, I(IDLE))
  redis.call('ZADD', P .. 'lexp', I(now + ttl), id)
  redis.call('PEXPIRE', P .. 'lexp', IDLE)
  redis.call('ZADD', P .. 'lref', I(now), id)
  redis.call('PEXPIRE', P .. 'lref', IDLE)
end

local doms = {}
for i, e in ipairs(encs) do doms[i] = dload(e) end

local ticket = tonumber(redis.call('HGET', wk, 't'))
if not ticket then
  -- First call: with nobody ahead anywhere, admit without queueing.
  local empty = true
  for _, d in ipairs(doms) do
    if redis.call('EXISTS', d.q) == 1 then empty = false break end
  end
  if empty then
    local slot, memb, wait = check(doms, 1 / 0)
    if not slot and not memb and wait == 0 then
      grant(doms)
      return {'1'}
    end
  end
  ticket = redis.call('HINCRBY', CFG, 'seq', 1)
  for _, d in ipairs(doms) do
    redis.call('ZADD', d.q, I(ticket), id)
    redis.call('PEXPIRE', d.q, IDLE)
  end
  redis.call('HSET', wk, 't', I(ticket), 'ds', table.concat(encs, ' '), 'ch', ch,
    'cs', consumer, 'c', I(class), 'm', I(mem), 'b', I(body), 'sb', '0', 'at', I(now))
end
-- Every call is also the waiter's liveness beat.
redis.call('ZADD', P .. 'wexp', I(now + ttl), id)
redis.call('PEXPIRE', P .. 'wexp', IDLE)
redis.call('PEXPIRE', wk, IDLE)

for _, d in ipairs(doms) do
  if head(d.q) ~= id then
    redis.call('PEXPIRE', d.q, IDLE)
    return {'2'}
  end
end

local slot, memb, wait = check(doms, ticket)
redis.call('HSET', wk, 'sb', slot and '1' or '0')
if memb then
  redis.call('ZADD', P .. 'memq', I(ticket), id)
  redis.call('PEXPIRE', P .. 'memq', IDLE)
else
  memq_remove(id)
end
if slot or memb or wait > 0 then
  for _, d in ipairs(doms) do dsave(d, now, lim) end
  if slot or memb then return {'2'} end
  return {'3', I(wait)}
end
grant(doms)
remove_waiter(id)
return {'1'}
