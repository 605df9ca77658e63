#!lua flags=allow-oom
-- uses: lib.lua
-- heartbeat: renew one process's session in a group, which keeps every
-- lease of the session alive: a few commands however many leases it holds.
--
-- KEYS[1]  config hash
-- ARGV[1..3] the common arguments (lib.lua)
-- ARGV[4]  lease TTL, ms: the session lives that long from now
-- ARGV[5]  session id
-- ARGV[6]  1 to renew the idle TTLs of the session's keys (the host asks
--          once a quarter of the idle TTL has passed since it last did),
--          else 0
-- ARGV[7]  number of domain encodings m, then ARGV[8..7+m] the encodings
--          of domains the session's leases count in whose hashes must
--          outlive them (the host lists each once per quarter idle TTL)
-- ARGV[8+m] number k of ids, then ARGV[9+m..8+m+2k] k pairs: the id of a
--          lease or waiter this process is done with (a lease it stopped
--          renewing, a cancellation that failed, a dropped lease it has
--          heard of) and a session a grant under it may be in. Each is
--          cancelled there (as cancel.lua does) and taken off the
--          session's dropped set; for one already gone that changes
--          nothing. An id may come with several sessions.
-- ARGV[9+m+2k] the epoch this host knows
-- Returns {R_UNREGISTERED} when the budget's config is gone,
-- {R_NEW_EPOCH, epoch} when the epoch differs (the host must re-assert its
-- leases first), {R_SESSION_GONE} when the session is dead (expired, or
-- ended by reclaim): every lease the host holds in it is lost, and it is
-- never renewed again; else {R_OK, ids of the session's leases an operator
-- dropped...}, repeated on every beat until the host lists them in
-- ARGV[8+m], so a lost reply loses none.
--
-- Cost: TIME, the config's fields, the restart check (INFO through
-- EVALSHA; in a library only on a server's first call) and three
-- commands for the session, plus, when the host asks, a PEXPIRE per key
-- and a PTTL per domain; nothing per lease.

local ttl = int(ARGV[4], 'lease ttl', 1, 86400000) * 1000
local sid = id_arg(ARGV[5], 'session id')
local renew = int(ARGV[6], 'renew flag', 0, 1)
local m = int(ARGV[7], 'domain count', 0, 1000000)
local k = int(ARGV[8 + m] or '', 'id count', 0, 1000000)
if #ARGV ~= 9 + m + 2 * k then bad('counts do not match the arguments') end
local encs, done_ids, done_sids = {}, {}, {}
for i = 8, 7 + m do encs[#encs + 1] = enc_arg(ARGV[i]) end
for i = 9 + m, 7 + m + 2 * k, 2 do
  done_ids[#done_ids + 1] = id_arg(ARGV[i], 'id')
  done_sids[#done_sids + 1] = id_arg(ARGV[i + 1], 'session id', true)
end
local known = ARGV[9 + m + 2 * k]

local now = clock()
local epoch = redis.call('HGET', CFG, 'epoch')
if not epoch then return {R_UNREGISTERED} end
if restarted() then epoch = new_epoch(now, ttl) end
if epoch ~= known then return {R_NEW_EPOCH, epoch} end
touch_cfg(now)
reclaim(now)
local sd = P .. 'sd:' .. sid
if #done_ids > 0 then
  for i, id in ipairs(done_ids) do
    remove_waiter(id, done_sids[i])
    retire(id, done_sids[i], 1, 1)
  end
  for first = 1, #done_ids, 1000 do
    redis.call('SREM', sd, unpack(done_ids, first, math.min(first + 999, #done_ids)))
  end
end
local sexp = P .. 'sexp'
local d = tonumber(redis.call('ZSCORE', sexp, sid))
if not d or d <= now then return done({R_SESSION_GONE}) end
redis.call('ZADD', sexp, I(now + ttl), sid)
-- A renewal with a shorter TTL than before can move a deadline earlier.
lower_rc(now + ttl)
if renew == 1 then
  expire(sexp, IDLE)
  expire(lxkey(sid), IDLE)
end
for _, enc in ipairs(encs) do
  local dk = P .. 'd:' .. enc
  if redis.call('PTTL', dk) < IDLE / 2 then
    expire(dk, IDLE)
    expire(P .. 'q:' .. enc, IDLE) -- a queue's TTL follows its domain's (lib.lua, qexpire)
  end
end
local out = {R_OK}
for _, id in ipairs(redis.call('SMEMBERS', sd)) do out[#out + 1] = id end
return done(out)
