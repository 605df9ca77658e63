-- uses: lib.lua
-- heartbeat: renew every live lease of one process in one call.
--
-- KEYS[1]  config hash
-- ARGV[3]  lease TTL, ms
-- ARGV[4]  number of lease ids n, then ARGV[5..4+n] the ids
-- ARGV[5+n] number of domain encodings m, then the encodings the leases use
--          (their hashes must outlive the leases that count in them)
-- Returns the ids that are no longer held (released, reclaimed or expired),
-- as a list of strings. An expired lease is reclaimed here rather than
-- renewed: renewal never brings a lease back.

local ttl = int(ARGV[3], 'lease ttl', 1, 86400000) * 1000
local n = int(ARGV[4], 'lease count', 0, 1000000)
local m = int(ARGV[5 + n], 'domain count', 0, 1000000)
if #ARGV ~= 5 + n + m then bad('counts do not match the arguments') end

local now = clock()
if redis.call('EXISTS', CFG) == 1 then touch_cfg() end
reclaim(now)
local lexp = P .. 'lexp'
local missing = {}
for i = 5, 4 + n do
  local lid = id_arg(ARGV[i], 'lease id')
  local exp = tonumber(redis.call('ZSCORE', lexp, lid))
  if not exp or exp <= now then
    if exp then retire(lid, 1, 1, 1) end
    missing[#missing + 1] = lid
  else
    redis.call('ZADD', lexp, 'XX', I(now + ttl), lid)
    redis.call('PEXPIRE', P .. 'l:' .. lid, IDLE)
  end
end
if n > 0 then redis.call('PEXPIRE', lexp, IDLE) end
for i = 6 + n, 5 + n + m do
  local dk = P .. 'd:' .. enc_arg(ARGV[i])
  if redis.call('PTTL', dk) < IDLE then redis.call('PEXPIRE', dk, IDLE) end
end
return missing
