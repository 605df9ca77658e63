#!lua
-- uses: lib.lua
-- reassert: after Redis lost the budget's state (a restart without
-- persistence, a failover that dropped writes), a host puts back the leases
-- it still holds, in its session, so counts are right again before the
-- quarantine ends. Idempotent by lease id: a lease that exists is left as
-- it is. The budget stays quarantined (no new grants) for one TTL of a
-- host that put leases back.
--
-- A dead session is put back alive for one TTL, even if what Redis holds
-- says it expired or ended: that state is older than the host's, whose
-- keeper re-asserts only leases it renewed within a TTL (their session's
-- deadline came back from disk, or went with the rest).
--
-- A re-assertion is the whole truth about the session: what the host no
-- longer holds, Redis must not count either. The state Redis came back
-- with can be older than a release (a replica promoted before it got the
-- retire), so after the last call of a re-assertion every lease of the
-- session that was granted before the epoch began and that the host did
-- not name is retired, and a named lease keeps only the parts the host
-- still holds. A lease granted in the new epoch was granted by this Redis,
-- which also saw whatever retired it, so it stays. A re-assertion of many
-- leases spans several calls; ra:<sid> collects the ids named by all but
-- the last.
--
-- KEYS[1]  config hash
-- ARGV[1..3] the common arguments (lib.lua)
-- ARGV[4]  lease TTL, ms
-- ARGV[5]  session id
-- ARGV[6]  1 for the first call of a re-assertion, plus 2 for its last
--          (3: a re-assertion of one call)
-- ARGV[7]  number of leases n, then per lease 5 fields and its domains:
--          id, class index, parts (1 request + 2 body: 1..3), consumer,
--          domain count k, then k domain encodings
-- Returns {R_UNREGISTERED} when the budget is not registered, else
-- {R_OK, count re-asserted}.

local ttl = int(ARGV[4], 'lease ttl', 1, 86400000) * 1000
local sid = id_arg(ARGV[5], 'session id')
local flags = int(ARGV[6], 'call flags', 0, 3)
local first, last = flags % 2 == 1, flags >= 2
local n = int(ARGV[7], 'lease count', 0, 1000000)
local now = clock()
local lim = lims()
if not lim then return {R_UNREGISTERED} end
touch_cfg(now)
if n > 0 then
  -- Alive, it is left to the heartbeat that follows to renew.
  local sexp = P .. 'sexp'
  local d = tonumber(redis.call('ZSCORE', sexp, sid))
  if not d or d <= now then
    redis.call('ZADD', sexp, I(now + ttl), sid)
    expire(sexp, IDLE)
    lower_rc(now + ttl)
    if not d then redis.call('ZREM', P .. 'sgone', sid) end
  end
end
local lx = lxkey(sid)
local ra = P .. 'ra:' .. sid
if first then redis.call('DEL', ra) end
local ids, named = {}, {}
local i, put = 8, 0
for _ = 1, n do
  local id = id_arg(ARGV[i], 'lease id')
  local class = int(ARGV[i + 1], 'class', 0, NCLASS - 1)
  local parts = int(ARGV[i + 2], 'parts', 1, 3)
  local consumer = ARGV[i + 3] or ''
  local k = int(ARGV[i + 4], 'domain count', 1, 10000)
  local encs = {}
  for j = 1, k do encs[j] = enc_arg(ARGV[i + 4 + j]) end
  i = i + 5 + k
  ids[#ids + 1] = id
  named[id] = true
  local rec = redis.call('HGET', lx, id)
  local l = rec and lease_unpack(rec)
  if l then
    -- Parts the host has retired since the state Redis came back with.
    local r = (l.hr == 1 and parts % 2 == 0) and 1 or 0
    local b = (l.hb == 1 and parts < 2) and 1 or 0
    if r == 1 or b == 1 then retire(id, sid, r, b, rec) end
  else
    local hr, hb = parts % 2, math.floor(parts / 2)
    for _, e in ipairs(encs) do
      local d = dload(e)
      if hr == 1 then d.f[class + 1] = d.f[class + 1] + 1 end
      if hb == 1 then d.b = d.b + 1 end
      dsave(d, now, lim)
    end
    lease_put(sid, id, lease_pack(hr, hb, class, now, sid, table.concat(encs, ','), consumer), true)
    put = put + 1
  end
end
if put > 0 then
  expire(lx, IDLE)
  -- Counts were missing these leases. If the budget was re-created by a
  -- host that could not know of the loss (it joined after it), nothing is
  -- quarantined yet: hold new grants until this host's holders are back. A
  -- host that put nothing back (its leases were all there, or it held
  -- none) leaves the quarantine as it is: re-asserting late, after its
  -- first lease of the new epoch, it would otherwise stop grants again.
  if lim.qu < now + ttl then cfg_put('qu', now + ttl) end
end
if not last then
  for j = 1, #ids, 1000 do
    local args = {}
    for x = j, math.min(j + 999, #ids) do
      args[#args + 1] = ids[x]
      args[#args + 1] = '1'
    end
    redis.call('HSET', ra, unpack(args))
  end
  expire(ra, IDLE)
  return done({R_OK, I(put)})
end
-- The last call: retire what the session holds in Redis but not on the
-- host, from before the epoch.
local epoch = tonumber(redis.call('HGET', CFG, 'epoch')) or now
local spanned = not first
local kv = redis.call('HGETALL', lx)
for j = 1, #kv, 2 do
  local id = kv[j]
  -- '' is the key's own field (lib.lua, lease_put), no lease.
  if id ~= '' and not named[id] and not (spanned and redis.call('HEXISTS', ra, id) == 1) then
    local l = lease_unpack(kv[j + 1])
    if not l then
      -- A queued waiter's marker is no lease, and stays (lib.lua,
      -- Queues); a record no build can read goes.
      if string.byte(kv[j + 1], 1) ~= 87 then redis.call('HDEL', lx, id) end
    elseif l.g < epoch then
      retire(id, sid, 1, 1, kv[j + 1])
    end
  end
end
if spanned then redis.call('DEL', ra) end
return done({R_OK, I(put)})
