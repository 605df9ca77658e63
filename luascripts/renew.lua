#!lua flags=allow-oom
-- uses: lib.lua
-- renew: one process keeps its queued waiters in a group alive, all in
-- one call, so a waiter blocked by a ceiling need not call acquire every
-- TTL/3 just to keep its place. A queued waiter lives as long as its
-- session (lib.lua, Queues): this renews the sessions the waiters name, as
-- a heartbeat does, for a process that may hold no lease there.
--
-- KEYS[1]  config hash
-- ARGV[1..3] the common arguments (lib.lua)
-- ARGV[4]  session TTL, ms: each live session named lives that long from now
-- ARGV[5]  number of waiters n (at most 1000), then ARGV[6..5+2n] n
--          pairs: a waiter's id and the session its latest call named
-- ARGV[6+2n] number of domain encodings m, then m encodings: domains of
--          those waiters that are queued (not held back by time). Whoever
--          of the ids heads one of their queues is tried as a handoff
--          would be (lib.lua, done): granted if it fits, woken if time
--          holds it back. A wake lost on its way to a head, which its
--          renewals would not notice (it is still queued), is so sent
--          again within a renewal.
-- Returns {R_UNREGISTERED} when the config is gone; {R_DELAYED, wait_us,
-- s} while the budget is quarantined after a state loss, having renewed
-- the sessions but tried nobody (as acquire does then: each waiter should call
-- for itself, and learns the wait); else {R_OK, s}, s one character per
-- id, in order:
--   w  still waiting: its session lives a TTL from now
--   g  granted: its lease exists (a handoff whose wake may have been lost)
--   x  neither: its session is dead, or it was cancelled or never queued
-- A session whose deadline has passed is not renewed even if reclaim has
-- not reached it yet: what expired stays expired.
--
-- Cost: the config's fields, TIME, a ZSCORE and a ZADD per session named
-- (nearly always one) and an HMGET of its markers, whatever n is; a GET
-- per domain listed, and a handoff's try for each head found among the ids.

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
if n == 0 then
  if now < lim.qu then return done({R_DELAYED, I(lim.qu - now)}) end
  return done({R_OK, ''})
end

-- By session: one renewal and one HMGET for each the waiters name.
local by, order = {}, {}
for i = 1, n do
  local s = sids[i]
  if not by[s] then
    by[s] = {}
    order[#order + 1] = s
  end
  by[s][#by[s] + 1] = i
end
local out, mine = {}, {}
local sexp = K.sexp
for _, s in ipairs(order) do
  local d = redis.call('ZSCORE', sexp, s)
  local alive = d and d + 0 > now
  if alive then
    redis.call('ZADD', sexp, I(now + ttl), s)
    -- A renewal with a shorter TTL than before can move a deadline earlier.
    lower_rc(now + ttl)
  end
  local q = {}
  for j, i in ipairs(by[s]) do q[j] = ids[i] end
  local recs = redis.call('HMGET', lxkey(s), unpack(q))
  for j, i in ipairs(by[s]) do
    local v = recs[j]
    if not v then
      out[i] = 'x'
    elseif string.byte(v, 1) == 87 then -- a marker (lib.lua, Queues)
      out[i] = alive and 'w' or 'x'
      if alive then mine[ids[i]] = true end
    else
      out[i] = 'g'
    end
  end
end
-- The sessions live on through a quarantine (their waiters keep their
-- places), but nobody moves in one: each waiter should call for itself.
if now < lim.qu then return done({R_DELAYED, I(lim.qu - now), table.concat(out)}) end
for _, e in ipairs(encs) do
  local h = q_head(dload(e))
  if h and mine[h.id] then candidate(h) end
end
return done({R_OK, table.concat(out)})
