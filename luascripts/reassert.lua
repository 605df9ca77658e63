#!lua
-- uses: lib.lua
-- reassert: after Redis lost the budget's state (a restart without
-- persistence, a failover that dropped writes), a host puts back the leases
-- it still holds, so counts are right again before the quarantine ends.
-- Idempotent by lease id: a lease that exists is left as it is. The budget
-- stays quarantined (no new grants) for one TTL of the re-asserting host.
--
-- KEYS[1]  config hash
-- ARGV[1..3] the common arguments (lib.lua)
-- ARGV[4]  lease TTL, ms
-- ARGV[5]  number of leases n, then per lease 5 fields and its domains:
--          id, class index, parts (1 request + 2 body: 1..3), consumer,
--          domain count k, then k domain encodings
-- Returns {R_UNREGISTERED} when the budget is not registered, else
-- {R_OK, count re-asserted}.

local ttl = int(ARGV[4], 'lease ttl', 1, 86400000) * 1000
local n = int(ARGV[5], 'lease count', 0, 1000000)
local now = clock()
local lim = lims()
if not lim then return {R_UNREGISTERED} end
touch_cfg(now)
-- The host saw the epoch change under it. If the budget was re-created by
-- a host that could not know of the loss (it joined after it), nothing is
-- quarantined yet: hold new grants until this host's holders are back.
if lim.qu < now + ttl then
  lim.qu = now + ttl
  redis.call('HSET', CFG, 'qu', I(lim.qu))
end
local i, put = 6, 0
for _ = 1, n do
  local id = id_arg(ARGV[i], 'lease id')
  local class = int(ARGV[i + 1], 'class', 0, NCLASS - 1)
  local parts = int(ARGV[i + 2], 'parts', 1, 3)
  local consumer = ARGV[i + 3] or ''
  local k = int(ARGV[i + 4], 'domain count', 1, 10000)
  local encs = {}
  for j = 1, k do encs[j] = enc_arg(ARGV[i + 4 + j]) end
  i = i + 5 + k
  local lk = P .. 'l:' .. id
  if redis.call('EXISTS', lk) == 0 then
    local hr, hb = parts % 2, math.floor(parts / 2)
    for _, e in ipairs(encs) do
      local d = dload(e)
      if hr == 1 then d['f' .. class] = d['f' .. class] + 1 end
      if hb == 1 then d.b = d.b + 1 end
      dsave(d, now, lim)
    end
    redis.call('HSET', lk, 'ds', table.concat(encs, ' '), 'c', I(class),
      'hr', I(hr), 'hb', I(hb), 'cs', consumer, 'g', I(now), 'ch', 'reasserted')
    redis.call('PEXPIRE', lk, I(IDLE))
    deadline(P .. 'lexp', now + ttl, id)
    put = put + 1
  end
end
redis.call('PEXPIRE', P .. 'lexp', IDLE)
return {R_OK, I(put)}
