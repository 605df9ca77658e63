#!lua
-- uses: lib.lua
-- acquire: one admission attempt for a waiter (budget.Store.TryAcquire).
--
-- KEYS[1]  config hash
-- ARGV[1..3] the common arguments (lib.lua)
-- ARGV[4]  waiter id (becomes the lease id on a grant)
-- ARGV[5]  process channel suffix (where wake events for this waiter go)
-- ARGV[6]  session id: the session the lease joins (lib.lua, Sessions),
--          by this call or by a handoff while the waiter is queued
-- ARGV[7]  class index 0..NCLASS-1
-- ARGV[8]  1 if the request opens a body, else 0
-- ARGV[9]  consumer (diagnostics)
-- ARGV[10] lease and waiter TTL, ms (a new session's too)
-- ARGV[11] number of domains n, then ARGV[12..11+n] domain encodings
--          (sorted, distinct)
-- ARGV[12+n] optional: the session the waiter's previous call named, when
--          it differs from ARGV[6]: a grant made into that one, by a
--          handoff or a call whose reply was lost, is found there
-- Every call looks for a lease and a waiter of its own id, even the first
-- the client sends: go-redis resends a call whose reply timed out, and a
-- call that skipped the look would grant the same id twice (fault 12).
-- Memory is not an argument: each host's Budget keeps its own memory line.
-- Returns:
--   {R_GRANTED, age_us}  granted; the lease lives at least TTL - age_us
--                        from now without a heartbeat (its session's
--                        deadline), and age_us is at least the time since
--                        the grant (0 now; more when an earlier call or
--                        another script's handoff granted it)
--   {R_QUEUED}           queued: wait for a wake event
--   {R_DELAYED, wait_us} delayed: try again after wait_us (rate or pause)
--   {R_UNREGISTERED}     the budget is not registered (config missing)
--   {R_SESSION_GONE}     the session is dead, and nothing was granted: call
--                        again naming a new one (a queued waiter keeps its
--                        place)
-- While the budget is quarantined after a state loss, every call is delayed.
-- Capacity this call frees (a waiter leaving) is handed to the next heads
-- before it returns (lib.lua, done).

local id = id_arg(ARGV[4], 'waiter id')
local ch = id_arg(ARGV[5], 'process channel', true)
local sid = id_arg(ARGV[6], 'session id', true)
local class = int(ARGV[7], 'class', 0, NCLASS - 1, true)
local body = int(ARGV[8], 'body flag', 0, 1, true)
local consumer = ARGV[9]
local ttl = int(ARGV[10], 'lease ttl', 1, 86400000, true) * 1000
local n = int(ARGV[11], 'domain count', 1, 10000, true)
if #ARGV ~= 11 + n and #ARGV ~= 12 + n then bad('domain count does not match the arguments') end
local psid = ARGV[12 + n]
if psid then psid = id_arg(psid, 'previous session id', true) else psid = sid end
local encs
if n == 1 then
  encs = split_encs(enc_arg(ARGV[12])) -- a list a library keeps (no comma in an encoding)
else
  encs = {}
  for i = 1, n do encs[i] = enc_arg(ARGV[11 + i]) end
end
-- The call's request, in the table the last call used (see try_grant).
local req = REUSE.areq
req.id, req.encs, req.class, req.body, req.consumer = id, encs, class, body, consumer
req.ch, req.sid, req.ttl, req.handoff = ch, sid, ttl, false

local now = clock()
local lim = lims()
if not lim then return {R_UNREGISTERED} end
vouch(lim, now, ttl)
touch_cfg(now)
reclaim(now)
-- After a state loss, counts are not trusted until every live holder has
-- had one TTL to re-assert its leases.
if now < lim.qu then
  return done({R_DELAYED, I(lim.qu - now)})
end

local rec, lsid = redis.call('HGET', lxkey(sid), id), sid
if not rec and psid ~= sid then rec, lsid = redis.call('HGET', lxkey(psid), id), psid end
local l = rec and lease_unpack(rec)
if l then
  -- A retried call, or a handoff: the grant stands, and is not made twice.
  local left = session(sid, ttl, now)
  if not left then return done({R_SESSION_GONE}) end
  if lsid ~= sid then
    -- Granted in an earlier session of this process, which it gave up
    -- while the grant's reply was on its way: nobody has held the lease
    -- yet, and its slots still count, so it moves to the session named.
    redis.call('HDEL', lxkey(lsid), id)
    lease_put(sid, id, lease_pack(l.hr, l.hb, l.c, l.g, sid, l.ds, l.cs))
  end
  return done({R_GRANTED, I(math.max(0, now - l.g, ttl - left))})
end
local w = wload(id)
local qread -- the queue's head as the shortcut below read it (a ZRANGE reply)
if not w and n == 1 and QH[P .. 'd:' .. encs[1]] then
  -- A first call on a domain whose queue this server last saw hold
  -- waiters (QH, a guess) reads the queue first, and behind a head joins
  -- without loading the domain: its flag says so already (a waiter's join
  -- sets it, and only a call that finds the queue empty clears it), and
  -- nothing else of it changes; grants and heartbeats renew its TTL. The
  -- rest of this script does the same with the domain loaded.
  local q = P .. 'q:' .. encs[1]
  local h = redis.call('ZRANGE', q, '0', '0', 'WITHSCORES')
  qread = h
  if h[1] and h[1] ~= id then
    HEADS[q] = h[1]
    local ticket = redis.call('HINCRBY', CFG, 'seq', '1')
    redis.call('ZADD', q, I(ticket), id)
    if NEXT then NEXT[q] = nil end
    wsave(id, wrec(ticket, class, body, now, ttl, ch, sid, encs[1], consumer))
    deadline(K.wexp, now + ttl, id) -- wexp holds the head's: no TTL to set
    return done(REPLY_QUEUED)
  end
end
local doms = REUSE.adoms
for i = #doms, n + 1, -1 do doms[i] = nil end
for i = 1, n do doms[i] = dload(encs[i]) end

local joined = false -- queued by this call
-- A queue found with a head (another waiter): it exists, and so does
-- wexp, which holds that waiter's deadline.
local hq
if w then
  -- A handoff grants into the session of the waiter's latest call (and
  -- with its TTL, where a record converted from an old hash lacked it).
  if w.sn ~= sid or w.ttl == 0 then
    w.sn = sid
    if w.ttl == 0 then w.ttl = ttl end
    wsave(id, w)
  else
    expire(P .. 'w:' .. id, IDLE)
  end
else
  -- First call: with nobody ahead anywhere, admit without queueing.
  -- A queue is looked at only where its domain says it may hold waiters.
  -- A queue's head and its ticket, read here, also say whether this
  -- waiter heads it once it joins, without reading it again.
  local empty = true
  local ht -- the head's ticket in hq
  for i = 1, n do
    local d = doms[i]
    if d.qf == 1 then
      local h = qread or redis.call('ZRANGE', d.q, '0', '0', 'WITHSCORES')
      if h[1] then
        HEADS[d.q], hq, ht = h[1], d.q, h[2] + 0
        empty = false
        break
      end
      HEADS[d.q] = false
      d.qf = 0
    end
  end
  if empty then
    for i = 1, n do doms[i].dirty = true end -- check refills buckets
    local slot, wait = check(req, doms, lim, now)
    if not slot and wait == 0 then
      local left = grant(req, doms, lim, now)
      if not left then return done({R_SESSION_GONE}) end
      return done({R_GRANTED, I(math.max(0, ttl - left))})
    end
  end
  local ticket = redis.call('HINCRBY', CFG, 'seq', '1')
  for i = 1, n do
    local d = doms[i]
    redis.call('ZADD', d.q, I(ticket), id)
    -- A head with an earlier ticket stays the head; else read it below.
    if not (d.q == hq and ht < ticket) then HEADS[d.q] = nil end
    if NEXT then NEXT[d.q] = nil end
    if d.q ~= hq then qexpire(d) end -- may have made it (lib.lua, qexpire)
    if d.qf ~= 1 then d.dirty = true end
    d.qf = 1 -- saved on every way out below
  end
  wsave(id, wrec(ticket, class, body, now, ttl, ch, sid, n == 1 and encs[1] or table.concat(encs, ','), consumer))
  joined = true
end
-- Every call is also the waiter's liveness beat. wexp's TTL is renewed
-- with the config's (touch_cfg), and set here only where this ZADD may
-- have made the key: a waiter already queued has its entry there, and so
-- has the head of a queue found.
deadline(K.wexp, now + ttl, id)
if joined and not hq then expire(K.wexp, IDLE) end

for i = 1, n do
  local d = doms[i]
  if head(d.q) ~= id then
    -- Each domain now says its queue may hold waiters (dsave writes only
    -- those that changed, and renews a TTL that is due, the queue's with
    -- it). A domain first met by this waiter is saved too, which lists it
    -- in doms for Usage.
    for k = 1, n do dsave(doms[k], now, lim, true) end
    return done(REPLY_QUEUED)
  end
end

local r, v = decide(req, doms, lim, now)
if r == 'granted' then return done({R_GRANTED, I(math.max(0, ttl - v))}) end
for i = 1, n do dsave(doms[i], now, lim) end -- keep the refilled buckets
if r == 'wait' then return done({R_DELAYED, I(v)}) end
if r == 'gone' then return done({R_SESSION_GONE}) end
return done(REPLY_QUEUED)
