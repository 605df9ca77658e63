#!lua flags=allow-oom
-- uses: lib.lua
-- heartbeat: renew every live lease of one process in one call.
--
-- KEYS[1]  config hash
-- ARGV[1..3] the common arguments (lib.lua)
-- ARGV[4]  lease TTL, ms
-- ARGV[5]  number of lease ids n, then ARGV[6..5+n] the ids
-- ARGV[6+n] number of domain encodings m, then the encodings the leases use
--          (their hashes must outlive the leases that count in them)
-- ARGV[7+n+m] number of lease ids k whose hashes need their idle TTL
--          renewed, then those ids (the host tracks when it last had each
--          renewed: hashes are renewed rarely, not every beat)
-- ARGV[8+n+m+k] the epoch this host knows
-- Returns {R_UNREGISTERED} when the budget's config is gone,
-- {R_NEW_EPOCH, epoch} when the epoch differs (the host must re-assert its
-- leases first), else {R_OK, ids no longer held (released, reclaimed or
-- expired)...}. An expired lease is reclaimed here rather than renewed:
-- renewal never brings a lease back.
--
-- Cost: per 1000 leases one ZMSCORE and one ZADD XX, instead of commands per
-- lease, plus one PEXPIRE per lease hash the host asks to renew.

local ttl = int(ARGV[4], 'lease ttl', 1, 86400000) * 1000
local n = int(ARGV[5], 'lease count', 0, 1000000)
local m = int(ARGV[6 + n], 'domain count', 0, 1000000)
local k = int(ARGV[7 + n + m] or '', 'renewal count', 0, 1000000)
if #ARGV ~= 8 + n + m + k then bad('counts do not match the arguments') end
for i = 6, 5 + n do id_arg(ARGV[i], 'lease id') end
local known = ARGV[8 + n + m + k]

local now = clock()
local epoch = redis.call('HGET', CFG, 'epoch')
if not epoch then return {R_UNREGISTERED} end
if restarted() then epoch = new_epoch(now, ttl) end
if epoch ~= known then return {R_NEW_EPOCH, epoch} end
touch_cfg(now)
reclaim(now)
local lexp = P .. 'lexp'
local exp = I(now + ttl)
local missing = {R_OK}
local CHUNK = 1000
for first = 6, 5 + n, CHUNK do
  local last = math.min(first + CHUNK - 1, 5 + n)
  local ids = {}
  for i = first, last do ids[#ids + 1] = ARGV[i] end
  local scores = redis.call('ZMSCORE', lexp, unpack(ids))
  local renew = {}
  for i, lid in ipairs(ids) do
    local e = tonumber(scores[i])
    if not e or e <= now then
      if e then
        retire(lid, 1, 1)
        redis.call('ZREM', lexp, lid)
      end
      missing[#missing + 1] = lid
    else
      renew[#renew + 1] = exp
      renew[#renew + 1] = lid
    end
  end
  if #renew > 0 then redis.call('ZADD', lexp, 'XX', unpack(renew)) end
end
if n > 0 then
  redis.call('PEXPIRE', lexp, IDLE)
  -- A renewal with a shorter TTL than before can move a deadline earlier.
  lower_rc(now + ttl)
end
for i = 8 + n + m, 7 + n + m + k do
  redis.call('PEXPIRE', P .. 'l:' .. id_arg(ARGV[i], 'lease id'), IDLE)
end
for i = 7 + n, 6 + n + m do
  local dk = P .. 'd:' .. enc_arg(ARGV[i])
  if redis.call('PTTL', dk) < IDLE / 2 then redis.call('PEXPIRE', dk, IDLE) end
end
return done(missing)
