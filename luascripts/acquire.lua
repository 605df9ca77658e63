#!lua
-- uses: lib.lua
-- acquire: one admission attempt for a waiter (budget.Store.TryAcquire).
--
-- KEYS[1]  config hash
-- ARGV[1..3] the common arguments (lib.lua)
-- ARGV[4]  waiter id (becomes the lease id on a grant)
-- ARGV[5]  process channel suffix (where wake events for this waiter go)
-- ARGV[6]  session id: the session the waiter and its lease belong to
--          (lib.lua, Sessions and Queues); a call creates it if new
-- ARGV[7]  class index 0..NCLASS-1
-- ARGV[8]  1 if the request opens a body, else 0
-- ARGV[9]  consumer (diagnostics)
-- ARGV[10] lease and session TTL, ms
-- ARGV[11] number of domains n, then ARGV[12..11+n] domain encodings
--          (sorted, distinct)
-- ARGV[12+n] optional: the session the waiter's previous call named, when
--          it differs from ARGV[6]: a grant made into that one, by a
--          handoff or a call whose reply was lost, is found there, and a
--          place in line kept there is given up (its session is dead, or
--          its process gave it up), to be taken again at the back
-- Every call looks for a lease and a waiter of its own id, even the first
-- the client sends: go-redis resends a call whose reply timed out, and a
-- call that skipped the look would grant the same id twice (fault 12), or
-- queue it twice.
-- Memory is not an argument: each host's Budget keeps its own memory line.
-- Returns:
--   {R_GRANTED, age_us}  granted; the lease lives at least TTL - age_us
--                        from now without a heartbeat (its session's
--                        deadline), and age_us is at least the time since
--                        the grant (0 now; more when an earlier call or
--                        another script's handoff granted it)
--   {R_QUEUED, left_us}  queued: wait for a wake event; the session lives
--                        at least left_us from now (and the waiter's place
--                        with it)
--   {R_DELAYED, wait_us} delayed: try again after wait_us (rate or pause)
--   {R_UNREGISTERED}     the budget is not registered (config missing)
--   {R_SESSION_GONE}     the session is dead, and nothing was granted: call
--                        again naming a new one
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
req.ch, req.sid, req.ttl, req.handoff, req.queued, req.left = ch, sid, ttl, false, false, false

local now = clock()
local lim = lims()
if not lim then return {R_UNREGISTERED} end
vouch(lim, now, ttl)
touch_cfg(now)
reclaim(now)
-- The session must live while the waiter does: a call of its process
-- creates or extends it, even in a quarantine.
local left = session(sid, ttl, now)
if not left then return done({R_SESSION_GONE}) end
req.left = left
-- After a state loss, counts are not trusted until every live holder has
-- had one TTL to re-assert its leases.
if now < lim.qu then
  return done({R_DELAYED, I(lim.qu - now)})
end

local lk = lxkey(sid)
if psid ~= sid then
  local prec = redis.call('HGET', lxkey(psid), id)
  if prec then
    local l = lease_unpack(prec)
    if l then
      -- Granted in an earlier session of this process, which it gave up
      -- while the grant's reply was on its way: nobody has held the lease
      -- yet, and its slots still count, so it moves to the session named.
      redis.call('HDEL', lxkey(psid), id)
      lease_put(sid, id, lease_pack(l.hr, l.hb, l.c, l.g, sid, l.ds, l.cs))
      return done({R_GRANTED, I(math.max(0, now - l.g, ttl - left))})
    end
    unqueue(id, psid, prec) -- its place went with that session
  end
end

local entry -- this waiter's entry, packed, once made

-- A first call on a domain whose queue this server last saw hold waiters
-- (QH, a guess) takes its place at the back without loading the domain:
-- one BITFIELD counts it in and reads where its entry goes, HSETNX makes
-- its marker unless it has one (a retried call, or one after a wake), and
-- APPEND writes the entry. Only one alone in line loads the domain, to
-- try it. A domain value of another version (or none) is left to the
-- loading path below.
local dkey = P .. 'd:' .. encs[1]
if n == 1 and STRUCT and QH[dkey] and not DC[encs[1]] then
  entry = epack(id, sid, ch, class, body, ttl, now, '', consumer)
  local r = redis.call('BITFIELD', dkey, 'GET', 'i64', '#0', 'INCRBY', 'i64', BFQ, '1',
    'INCRBY', 'i64', BFQL, I(#entry), 'GET', 'i64', BFQB)
  local function undo()
    redis.call('BITFIELD', dkey, 'INCRBY', 'i64', BFQ, '-1', 'INCRBY', 'i64', BFQL, I(-#entry))
  end
  if r[1] ~= DVERSION then
    if r[1] == 0 then redis.call('DEL', dkey) else undo() end
  elseif r[2] > 1 then
    local at = r[4] + r[3] - #entry
    if lease_put(sid, id, 'W' .. I(at) .. ' ' .. encs[1], false, true) then
      if redis.call('APPEND', P .. 'q:' .. encs[1], entry) == r[3] then
        return done({R_QUEUED, I(left)})
      end
      -- The string is not where the domain's account says (a state loss
      -- took one of the two): the counts are undone, and the loading
      -- path's join starts the line again (q_append), as it would have
      -- without this shortcut. (Taking the string's length as the
      -- account instead left this entry in the line uncounted, to be
      -- granted a second time once it headed it.)
      redis.call('HDEL', lk, id)
    end
    undo()
  else
    undo() -- alone in line: the loading path decides
  end
end

-- The same in a batch, whose earlier operations loaded the domain and
-- read its queue's head (DC, HEADS): with somebody else ahead, a first
-- call joins at the back. Its marker is made first, and only if it has
-- none (HSETNX): then this is a first call, as the look below would have
-- found, and nothing needs reading. One with a marker or a lease goes the
-- long way.
local d1 = n == 1 and DC[encs[1]]
local h1 = d1 and HEADS[d1.q]
if h1 and h1.id ~= id then
  entry = entry or epack(id, sid, ch, class, body, ttl, now, '', consumer)
  local at = d1.qb + d1.ql
  if lease_put(sid, id, 'W' .. I(at) .. ' ' .. encs[1], false, true) then
    local got = q_append(d1, entry)
    if got == at then
      dsave(d1, now, lim, true)
      return done({R_QUEUED, I(left)})
    end
    -- The string was not what the domain said, and the line started
    -- again with this entry: the marker says where, and the long way
    -- finds the waiter queued there, at the head.
    lease_put(sid, id, 'W' .. I(got) .. ' ' .. encs[1])
  end
end

local rec = redis.call('HGET', lk, id)
local l = rec and lease_unpack(rec)
if l then
  -- A retried call, or a handoff: the grant stands, and is not made twice.
  return done({R_GRANTED, I(math.max(0, now - l.g, ttl - left))})
end
local doms = REUSE.adoms
for i = #doms, n + 1, -1 do doms[i] = nil end
for i = 1, n do doms[i] = dload(encs[i]) end

local offs = rec and mparse(rec)
if offs then
  -- Queued already (by an earlier call of this waiter): it moves only
  -- when it heads every queue it is in. A place that is gone (a state
  -- loss) is given up, and the waiter joins again below.
  local heads, lost = true, false
  for i = 1, n do
    local d = doms[i]
    local e = offs[i] and queued_at(d, offs[i], id)
    if not e then
      lost = true
    elseif q_head(d) ~= e then
      heads = false
    end
  end
  if lost then
    unqueue(id, sid, rec)
    offs = nil
  elseif not heads then
    for i = 1, n do dsave(doms[i], now, lim, true) end
    return done({R_QUEUED, I(left)})
  end
  req.queued = true
else
  -- First call: with nobody ahead anywhere, admit without queueing.
  local empty = true
  for i = 1, n do
    if q_head(doms[i]) then
      empty = false
      break
    end
  end
  if empty then
    for i = 1, n do doms[i].dirty = true end -- check refills buckets
    local slot, wait = check(req, doms, lim, now)
    if not slot and wait == 0 then
      grant(req, doms, lim, now)
      return done({R_GRANTED, I(math.max(0, ttl - left))})
    end
  end
end
if not offs then
  -- Join: an entry at the back of each queue, and the marker that says
  -- where (each domain is saved below, on every way out).
  local ds = n == 1 and '' or table.concat(encs, ',')
  entry = entry or epack(id, sid, ch, class, body, ttl, now, ds, consumer) -- (the shortcut's, if it made one)
  local at = {}
  for i = 1, n do at[i] = I(q_append(doms[i], entry, i > 1)) end
  lease_put(sid, id, 'W' .. table.concat(at, ',') .. ' ' .. (n == 1 and encs[1] or ds))
  req.queued = true
  for i = 1, n do
    if q_head(doms[i]).id ~= id then
      for k = 1, n do dsave(doms[k], now, lim, true) end
      return done({R_QUEUED, I(left)})
    end
  end
end

local r, v = decide(req, doms, lim, now)
if r == 'granted' then return done({R_GRANTED, I(math.max(0, ttl - v))}) end
for i = 1, n do dsave(doms[i], now, lim) end -- keep the refilled buckets
if r == 'wait' then return done({R_DELAYED, I(v)}) end
if r == 'gone' then return done({R_SESSION_GONE}) end
return done({R_QUEUED, I(left)})
