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
-- KEYS[1]  config hash
-- ARGV[1..3] the common arguments (lib.lua)
-- ARGV[4]  lease TTL, ms
-- ARGV[5]  session id
-- ARGV[6]  number of leases n, then per lease 5 fields and its domains:
--          id, class index, parts (1 request + 2 body: 1..3), consumer,
--          domain count k, then k domain encodings
-- Returns {R_UNREGISTERED} when the budget is not registered, else
-- {R_OK, count re-asserted}.

local ttl = int(ARGV[4], 'lease ttl', 1, 86400000) * 1000
local sid = id_arg(ARGV[5], 'session id')
local n = int(ARGV[6], 'lease count', 0, 1000000)
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
    redis.call('PEXPIRE', sexp, IDLE)
    lower_rc(now + ttl)
    if not d then redis.call('ZREM', P .. 'sgone', sid) end
  end
end
local lx = P .. 'lx'
local i, put = 7, 0
for _ = 1, n do
  local id = id_arg(ARGV[i], 'lease id')
  local class = int(ARGV[i + 1], 'class', 0, NCLASS - 1)
  local parts = int(ARGV[i + 2], 'parts', 1, 3)
  local consumer = ARGV[i + 3] or ''
  local k = int(ARGV[i + 4], 'domain count', 1, 10000)
  local encs = {}
  for j = 1, k do encs[j] = enc_arg(ARGV[i + 4 + j]) end
  i = i + 5 + k
  if redis.call('HEXISTS', lx, id) == 0 then
    local hr, hb = parts % 2, math.floor(parts / 2)
    for _, e in ipairs(encs) do
      local d = dload(e)
      if hr == 1 then d['f' .. class] = d['f' .. class] + 1 end
      if hb == 1 then d.b = d.b + 1 end
      dsave(d, now, lim)
    end
    redis.call('HSET', lx, id, lease_pack(hr, hb, class, now, sid, table.concat(encs, ','), consumer))
    redis.call('SADD', P .. 'sl:' .. sid, id)
    put = put + 1
  end
end
if put > 0 then
  redis.call('PEXPIRE', lx, IDLE)
  redis.call('PEXPIRE', P .. 'sl:' .. sid, IDLE)
  -- Counts were missing these leases. If the budget was re-created by a
  -- host that could not know of the loss (it joined after it), nothing is
  -- quarantined yet: hold new grants until this host's holders are back. A
  -- host that put nothing back (its leases were all there, or it held
  -- none) leaves the quarantine as it is: re-asserting late, after its
  -- first lease of the new epoch, it would otherwise stop grants again.
  if lim.qu < now + ttl then
    lim.qu = now + ttl
    redis.call('HSET', CFG, 'qu', I(lim.qu))
  end
end
return {R_OK, I(put)}
