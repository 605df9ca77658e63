package main

import (
	"context"

	"github.com/redis/go-redis/v9"
)

// The third yardstick (-sketch): the layout the plan calls layout 2, with
// the Lua written as flat as lean.go's, so that its count says what that
// layout change alone would buy before anyone builds it. Against today's
// records it makes three changes:
//   - a queued waiter's record is a field of lx, the hash that holds the
//     leases, under the waiter's id: the join's look for a resent call (the
//     HGET of lx today's join already sends) finds a waiter as well as a
//     lease, so the GET of w: goes, and a grant overwrites the field with
//     the lease's record (HSET) instead of deleting a key of its own;
//   - a waiter's liveness is its session's: it is listed in its session's
//     set from its join (SADD there, none at its grant) and its record
//     carries its own deadline for the check a handoff makes, so wexp (a
//     ZADD at the join, a ZSCORE and a ZREM at the handoff) goes;
//   - nothing else: the queue, the ticket, the domain's packed counts and
//     the wake are today's.
//
// A join is then 8 commands (TIME, HMGET, HGET, ZRANGE, HINCRBY, ZADD,
// HSET, SADD) and a handoff 13 (TIME, HMGET, HGET of the lease, GET of the
// domain, ZRANGE, HGET of the head, ZSCORE of its session, HSET, ZREM,
// SET, PUBLISH, SREM, HDEL): 21 where today's scripts send 26. What it
// leaves out is what lean.go leaves out, so it is a floor for layout 2,
// as lean.go's is for today's.
const lean2Lib = `#!lua name=rblean2
` + leanPrelude + `local WF = '>BBi8BBi8i8I4c0I4c0I4c0I4c0'
redis.register_function('lean2_join', function(KEYS, ARGV)
  local id, ch, sid = idok(ARGV[4]), rep(ARGV[5]), rep(ARGV[6])
  local class, body, consumer = tonumber(ARGV[7]), tonumber(ARGV[8]), ARGV[9]
  local ttl, idle, enc = tonumber(ARGV[10]) * 1000, tonumber(ARGV[2]), rep(ARGV[12])
  local now, p = open(KEYS[1])
  local lx = p .. 'lx'
  -- One look finds a resent call's lease (kind 1) or its place (kind 2).
  local old = redis.call('HGET', lx, id)
  if old then
    if string.byte(old) == 1 then return {'1', '0'} end
    return {'2'}
  end
  local dk, q = p .. 'd:' .. enc, p .. 'q:' .. enc
  local h = QH[dk] and redis.call('ZRANGE', q, '0', '0', 'WITHSCORES')
  if not (h and h[1]) then
    local ver, qf = struct.unpack('>i8i8', redis.call('GET', dk))
    if qf == 1 then redis.call('ZRANGE', q, '0', '0', 'WITHSCORES') end
  end
  local ticket = redis.call('HINCRBY', KEYS[1], 'seq', '1')
  redis.call('ZADD', q, string.format('%d', ticket), id)
  redis.call('HSET', lx, id, struct.pack(WF, 2, 1, ticket, class, body, now + ttl, ttl, #ch, ch, #sid, sid, #enc, enc, #consumer, consumer))
  local sl = p .. 'sl:' .. sid
  if redis.call('SADD', sl, id, '') == 2 then redis.call('PEXPIREAT', sl, expat(now, idle)) end
  CB[id] = class * 2 + body
  return {'2'}
end)
redis.register_function('lean2_handoff', function(KEYS, ARGV)
  local lid, idle = idok(ARGV[4]), tonumber(ARGV[2])
  local parts = tonumber(ARGV[5])
  local now, p, cap = open(KEYS[1])
  local lx = p .. 'lx'
  local rec = redis.call('HGET', lx, lid)
  if not rec or string.byte(rec) ~= 1 then return {'1'} end
  local lv, hr, hb, c, g, lsid, encs, cs = struct.unpack(LF, rec)
  local ci = c + 1
  local dk, q = p .. 'd:' .. encs, p .. 'q:' .. encs
  local v, qf, b, bk, tk, ta, th, pu, rx, wm, da, bs, ss, sa, fs, ep, f1, f2, f3, f4, f5, f6 = struct.unpack(DF, redis.call('GET', dk))
  local f = {f1, f2, f3, f4, f5, f6}
  QH[dk] = qf == 1 or nil
  if hr == 1 and parts % 2 == 1 and f[ci] > 0 then f[ci] = f[ci] - 1 end
  local hq = redis.call('ZRANGE', q, '0', '1')
  redis.call('SREM', p .. 'sl:' .. lsid, lid)
  local head, nxt = hq[1], hq[2]
  if head then
    local kind, wv, t, wc, wb, live, wttl, wch, wsn, wds, wcs = struct.unpack(WF, redis.call('HGET', lx, head))
    if f[wc + 1] < cap then
      local sd = tonumber(redis.call('ZSCORE', p .. 'sexp', wsn))
      if sd and sd > now and live > now then
        f[wc + 1] = f[wc + 1] + 1
        local x = (now - sa) / 2000000
        if x > 0 then ss = ss * math.exp(-x) end
        ss, sa = ss + 0.5, now
        redis.call('SET', dk, struct.pack(DF, v, qf, b, bk, tk, ta, th, pu, rx, wm, da, bs, ss, sa, fs, ep,
          f[1], f[2], f[3], f[4], f[5], f[6]), 'KEEPTTL')
        -- The waiter's field becomes its lease's; it is already in its
        -- session's set.
        redis.call('HSET', lx, head, struct.pack(LF, 1, 1, wb, wc, now, #wsn, wsn, #wds, wds, #wcs, wcs))
        redis.call('ZREM', q, head)
        local left = sd - now
        if live < sd then left = live - now end
        redis.call('PUBLISH', p .. 'wake:' .. wch, 'granted ' .. head .. ' ' .. wsn .. ' ' .. string.format('%d', wttl - left))
        if nxt then
          local cb = CB[nxt]
          if not cb then cb = 2 * select(4, struct.unpack('>BBi8B', redis.call('HGET', lx, nxt))) end
          if f[(cb - cb % 2) / 2 + 1] < cap then
            redis.call('HDEL', lx, lid)
            return {'1', nxt}
          end
        end
      end
    end
  end
  redis.call('HDEL', lx, lid)
  return {'1'}
end)
`

// lean2Admission counts a contended admission of lean2Lib in the setting
// leanAdmission uses (one slot held, ahead waiters behind it), on keys of
// its own.
func lean2Admission(ctx context.Context, c *redis.Client, ahead int, counted func(string, int, func() error) (float64, error)) (float64, error) {
	return leanCount(ctx, c, lean2Lib, "lean2", ahead, counted)
}
