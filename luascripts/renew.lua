#!lua flags=allow-oom
-- uses: lib.lua
-- renew: one process renews the liveness of its queued waiters in a group,
-- all in one call, so a waiter blocked by a ceiling need not call acquire
-- every TTL/3 just to keep its place (lib.lua, wexp).
--
-- KEYS[1]  config hash
-- ARGV[1..3] the common arguments (lib.lua)
-- ARGV[4]  waiter TTL, ms: each waiter still queued lives that long from now
-- ARGV[5]  number of waiters n (at most 1000), then ARGV[6..5+2n] n
--          pairs: a waiter's id and the session its latest call named
--          (where a handoff grants it)
-- ARGV[6+2n] number of domain encodings m, then m encodings: domains of
--          those waiters that are queued (not held back by time). Whoever
--          of the ids heads one of their queues is tried as a handoff
--          would be (lib.lua, done): granted if it fits, woken if time
--          holds it back. A wake lost on its way to a head, which its
--          renewals would not notice (it is still queued), is so sent
--          again within a renewal.
-- Returns {R_UNREGISTERED} when the config is gone; {R_DELAYED, wait_us}
-- while the budget is quarantined after a state loss, renewing nothing
-- (as acquire does then: each waiter should call for itself, and learns
-- the wait); else {R_OK, s}, s one character per id, in order:
--   w  still waiting: its deadline is now + TTL
--   g  granted: its lease exists (a handoff whose wake may have been lost)
--   x  neither: reclaimed, cancelled, or never queued
-- A waiter whose deadline has passed is not renewed even if reclaim has
-- not reached it yet: what expired stays expired.
--
-- Cost: the config's fields, TIME, and four commands (ZMSCORE, HMGET of
-- the leases for the ids not waiting, one per session they name: nearly
-- always one; ZADD XX, PEXPIREAT), whatever n is; one
-- ZRANGE per domain, and a handoff's try for each head found among the
-- ids (usually blocked by a ceiling: its domains' GETs).

local ttl = int(ARGV[4], 'waiter ttl', 1, 86400000, true) * 1000
local n = int(ARGV[5] or '', 'id count', 0, 1000)
local m = int(ARGV[6 + 2 * n] or '', 'domain count', 0, 10000)
if #ARGV ~= 6 + 2 * n + m then bad('counts do not match the arguments') end
local ids, sids, encs = {}, {}, {}
for i = 1, n do
  ids[i] = id_arg(ARGV[4 + 2 * i], 'waiter id')
  sids[i] = id_arg(ARGV[5 + 2 * i], 'session id', true)
end
for i = 1, m do encs[i] = enc_arg(ARGV[6 + 2 * n + i]) end

local now = clock()
local lim = lims()
if not lim then return {R_UNREGISTERED} end
touch_cfg(now)
reclaim(now)
if now < lim.qu then return done({R_DELAYED, I(lim.qu - now)}) end
if n == 0 then return done({R_OK, ''}) end

local wexp = P .. 'wexp'
local scores = redis.call('ZMSCORE', wexp, unpack(ids))
local out, renew, rest, at = {}, {}, {}, I(now + ttl)
for i = 1, n do
  local sc = scores[i] and tonumber(scores[i])
  if sc and sc > now then
    out[i] = 'w'
    renew[#renew + 1], renew[#renew + 2] = at, ids[i]
  else
    out[i] = 'x'
    rest[#rest + 1] = i
  end
end
if #rest > 0 then
  -- By session: one HMGET for each the waiters name.
  local by, order = {}, {}
  for _, i in ipairs(rest) do
    local s = sids[i]
    if not by[s] then
      by[s] = {}
      order[#order + 1] = s
    end
    by[s][#by[s] + 1] = i
  end
  for _, s in ipairs(order) do
    local q = {}
    for j, i in ipairs(by[s]) do q[j] = ids[i] end
    local recs = redis.call('HMGET', lxkey(s), unpack(q))
    for j, i in ipairs(by[s]) do
      if recs[j] then out[i] = 'g' end
    end
  end
end
if #renew > 0 then
  -- XX: only ids read above are here, but a renewal must never add one.
  redis.call('ZADD', wexp, 'XX', unpack(renew))
  -- A shorter TTL than the waiter's last call's moves its deadline earlier.
  lower_rc(now + ttl)
  expire(wexp, IDLE)
end
if m > 0 then
  local mine = {}
  for i = 1, n do
    if out[i] == 'w' then mine[ids[i]] = true end
  end
  for _, e in ipairs(encs) do
    local h = head(P .. 'q:' .. e)
    if h and mine[h] then candidate(h) end
  end
end
return done({R_OK, table.concat(out)})
