#!lua flags=allow-oom
-- uses: lib.lua
-- inspect: everything an operator needs to see of a budget, as one JSON
-- document. Read-only apart from the reclaim step every script runs.
--
-- KEYS[1]  config hash
-- ARGV[1..3] the common arguments (lib.lua)
-- ARGV[4]  most leases and most waiters to list
-- Returns {R_UNREGISTERED} when the budget does not exist, else
-- {R_OK, json} with
--   now, epoch, limits (the stored JSON),
--   domains: [{enc, f0..f<NCLASS-1>, b, tokens, burst, rate, factor, pause_us,
--              queue, throttled}]   (tokens/burst/rate empty when unlimited)
--   leases:  [{id, ds, c, parts, consumer, granted, expires, session}]
--            (expires: the session's deadline; sessions by deadline)
--   waiters: [{id, ds, c, b, consumer, ticket, arrived, expires, session}]
--            (ticket: the arrival, us; expires: the session's deadline;
--            in arrival order)
-- Times are the call's clock (Redis TIME) in microseconds, as strings.

local most = int(ARGV[4], 'most', 0, 1000000)
local now = clock()
local lim = lims()
if not lim then return {R_UNREGISTERED} end
reclaim(now)
local cfg = redis.call('HMGET', CFG, 'epoch', 'json')
local out = {now = I(now), epoch = cfg[1] or '', limits = cfg[2] or '',
  domains = {}, leases = {}, waiters = {}}

for _, enc in ipairs(redis.call('ZRANGE', P .. 'doms', 0, -1)) do
  local d = dload(enc)
  if not d.new then
    local f = factor(d, now)
    local ql = d.nw
    local row = {enc = enc, b = I(d.b),
      factor = F(f), pause_us = I(math.max(0, d.pu - now)), queue = I(ql),
      throttled = I(d.th), tokens = '', burst = '', rate = ''}
    for c = 1, NCLASS do row['f' .. (c - 1)] = I(d.f[c]) end
    local r, burst = rate(d, now, lim)
    if r > 0 then
      refill(d, now, r, burst) -- on the local copy only; nothing is saved
      row.tokens, row.burst, row.rate = F(d.tk), F(burst), F(r)
    end
    out.domains[#out.domains + 1] = row
  end
end

local listed, waiting = 0, 0
local ss = redis.call('ZRANGE', P .. 'sexp', 0, -1, 'WITHSCORES')
for i = 1, #ss, 2 do
  if listed >= most and waiting >= most then break end
  local kv = redis.call('HGETALL', lxkey(ss[i]))
  for j = 1, #kv, 2 do
    local lid, v = kv[j], kv[j + 1]
    local offs, ds = nil, nil
    if lid ~= '' then offs, ds = mparse(v) end -- '': the key's own field (lib.lua, lease_put)
    if offs then
      -- A waiter's marker: its entry in its first queue has the rest.
      local es = split_encs(ds)
      local e = waiting < most and queued_at(dload(es[1]), offs[1], lid)
      if e then
        waiting = waiting + 1
        out.waiters[#out.waiters + 1] = {id = lid, ds = (string.gsub(ds, ',', ' ')), c = I(e.c), b = I(e.b),
          consumer = e.cs, ticket = I(e.at), arrived = I(e.at), expires = ss[i + 1], session = ss[i]}
      end
    else
      local l = lid ~= '' and listed < most and lease_unpack(v)
      if l then
        listed = listed + 1
        out.leases[#out.leases + 1] = {id = lid, ds = (string.gsub(l.ds, ',', ' ')), c = I(l.c),
          parts = I(l.hr + 2 * l.hb), consumer = l.cs, granted = I(l.g), expires = ss[i + 1], session = ss[i]}
      end
    end
  end
end
-- Waiters in arrival order, as their queues hold them.
table.sort(out.waiters, function(a, b) return a.arrived + 0 < b.arrived + 0 end)
return done({R_OK, cjson.encode(out)})
