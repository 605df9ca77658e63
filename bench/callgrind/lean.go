package main

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"math"
	"strconv"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
)

// The second yardstick (-sketch): layout 1 and its commands (today's, layout
// 2's, and the SADD and SREM of layout 1's session sets), with the Lua
// around them written flat. A join sends the 9 commands of
// today's acquire that queues behind another waiter, in its order, on the
// same keys and values (the config's json and pc, the lease hash, the
// waiter's record, the queue, wexp; the domain is not read behind a head,
// and the queue's and wexp's TTLs are not due); a handoff sends the 17 of today's retire
// that hands the slot to the head (lease read and dropped, domain read and
// written, head and next read, waiter record, session and liveness scores,
// lease written, session set, queue, wexp, the wake; the next head is
// judged from what the library knows of it, without its record). Records are unpacked into locals, not
// tables (but for the six class counts, in one small table); the ceilings
// are parsed once per JSON; repeated arguments are checked once; per-call
// state lives in locals. Besides the commands it
// does the contended path's checks: ids, the quarantine, the reclaim and
// config-TTL deadlines, the ceiling, the session's and the waiter's
// liveness, the start rate. It leaves out what costs no command on this
// path but some Lua in the real one: the group clock's arithmetic over a
// clock jump, the epoch and throttle checks, the strict parsing of numbers,
// the save's TTL decision, the caches that spare commands elsewhere, and
// the loops over several domains and candidates. So it is a floor for a
// rewrite of the Lua on today's layout, not a plan: it says how much of
// today's 630k is the layout's commands and how much the way the Lua
// around them is written.
const leanLib = `#!lua name=rblean
` + leanPrelude + `local WF = '>Bi8BBi8i8I4c0I4c0I4c0I4c0'
redis.register_function('lean_join', function(KEYS, ARGV)
  local id, ch, sid = idok(ARGV[4]), rep(ARGV[5]), rep(ARGV[6])
  local class, body, consumer = tonumber(ARGV[7]), tonumber(ARGV[8]), ARGV[9]
  local ttl, idle, enc = tonumber(ARGV[10]) * 1000, tonumber(ARGV[2]), rep(ARGV[12])
  local now, p = open(KEYS[1])
  if redis.call('HGET', p .. 'lx', id) then return {'1', '0'} end
  local dk, q = p .. 'd:' .. enc, p .. 'q:' .. enc
  local wk = p .. 'w:' .. id
  if redis.call('GET', wk) then return {'2'} end
  -- The head and its ticket, read first where the domain's queue was last
  -- seen with waiters: behind a head the domain need not be read. (With
  -- nobody ahead the real script checks the ceiling, which here is always
  -- full: one slot, held.)
  local h = QH[dk] and redis.call('ZRANGE', q, '0', '0', 'WITHSCORES')
  if not (h and h[1]) then
    local ver, qf = struct.unpack('>i8i8', redis.call('GET', dk))
    if qf == 1 then redis.call('ZRANGE', q, '0', '0', 'WITHSCORES') end
  end
  local ticket = redis.call('HINCRBY', KEYS[1], 'seq', '1')
  redis.call('ZADD', q, string.format('%d', ticket), id)
  redis.call('SET', wk, struct.pack(WF, 1, ticket, class, body, now, ttl, #ch, ch, #sid, sid, #enc, enc, #consumer, consumer), 'PXAT', expat(now, idle))
  redis.call('ZADD', p .. 'wexp', string.format('%d', now + ttl), id)
  CB[id] = class * 2 + body
  return {'2'}
end)
redis.register_function('lean_handoff', function(KEYS, ARGV)
  local lid, idle = idok(ARGV[4]), tonumber(ARGV[2])
  local parts = tonumber(ARGV[5])
  local now, p, cap = open(KEYS[1])
  local lx = p .. 'lx'
  local rec = redis.call('HGET', lx, lid)
  if not rec then return {'1'} end
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
    local wv, t, wc, wb, at, wttl, wch, wsn, wds, wcs = struct.unpack(WF, redis.call('GET', p .. 'w:' .. head))
    if f[wc + 1] < cap then
      local sd = tonumber(redis.call('ZSCORE', p .. 'sexp', wsn))
      local live = tonumber(redis.call('ZSCORE', p .. 'wexp', head))
      if sd and sd > now and live and live > now then
        f[wc + 1] = f[wc + 1] + 1
        -- The start rate, as for a domain with no rate ceiling.
        local x = (now - sa) / 2000000
        if x > 0 then ss = ss * math.exp(-x) end
        ss, sa = ss + 0.5, now
        redis.call('SET', dk, struct.pack(DF, v, qf, b, bk, tk, ta, th, pu, rx, wm, da, bs, ss, sa, fs, ep,
          f[1], f[2], f[3], f[4], f[5], f[6]), 'KEEPTTL')
        -- lx still holds the retired lease (its HDEL comes last): no TTL to renew.
        redis.call('HSET', lx, head, struct.pack(LF, 1, 1, wb, wc, now, #wsn, wsn, #wds, wds, #wcs, wcs))
        local sl = p .. 'sl:' .. wsn
        if redis.call('SADD', sl, head, '') == 2 then redis.call('PEXPIREAT', sl, expat(now, idle)) end
        redis.call('ZREM', q, head)
        redis.call('DEL', p .. 'w:' .. head)
        redis.call('ZREM', p .. 'wexp', head)
        local left = sd - now
        if live < sd then left = live - now end
        redis.call('PUBLISH', p .. 'wake:' .. wch, 'granted ' .. head .. ' ' .. wsn .. ' ' .. string.format('%d', wttl - left))
        if nxt then
          -- The next head: judged blocked from what its join noted, left
          -- asleep; read only if unknown.
          local cb = CB[nxt]
          if not cb then cb = 2 * select(3, struct.unpack('>Bi8B', redis.call('GET', p .. 'w:' .. nxt))) end
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

// leanAdmission counts a contended admission of leanLib: the same setting as the
// store's contended workload (one slot held, ahead waiters behind it), on
// keys of its own that it writes as today's scripts would have.
func leanAdmission(ctx context.Context, c *redis.Client, ahead int, counted func(string, int, func() error) (float64, error)) (float64, error) {
	return leanCount(ctx, c, leanLib, "lean", ahead, counted)
}

// leanCount loads lib, whose functions are fn_join and fn_handoff, writes
// its keys under a budget of its own, and counts a contended admission of
// it.
func leanCount(ctx context.Context, c *redis.Client, lib, fn string, ahead int, counted func(string, int, func() error) (float64, error)) (float64, error) {
	if err := c.FunctionLoadReplace(ctx, lib).Err(); err != nil {
		return 0, err
	}
	const session, ch = "d4cad416-7373-4473-bd57-26fe73a94422.0", "d4cad416-7373-4473-bd57-26fe73a94422"
	cfg, holder, err := leanKeys(ctx, c, "cg-"+fn, session, 176)
	if err != nil {
		return 0, err
	}
	idle := strconv.Itoa(20 * 3600 * 1000)
	return countLine(fn, ahead, holder, counted, func(id string) error {
		return c.FCall(ctx, fn+"_join", []string{cfg}, "PUBLISH", idle, "", id, ch, session,
			"2", "0", "callgrind", strconv.Itoa(3600*1000), "1", leanEnc).Err()
	}, func(holder string) error {
		return c.FCall(ctx, fn+"_handoff", []string{cfg}, "PUBLISH", idle, "", holder, "3").Err()
	})
}

// leanEnc is the encoded domain both lean yardsticks use.
const leanEnc = "1.6430"

// leanPrelude is what the lean libraries start with: the record formats
// they share, the argument checks and what every call opens with (the
// clock, the prefix, the limits, and the config's epoch, which layout 3
// takes as its caches' generation).
const leanPrelude = `local DF = '>i8i8i8ddddddddddddd' .. 'i8i8i8i8i8i8'
local LF = '>BBBBi8I4c0I4c0I4c0'
local PCF = '>i8i8i8i8i8i8i8'
local CAPS, OK, CB, QH = {}, {}, {}, {}
local function idok(v)
  if #v > 200 or not string.find(v, '^%S+$') then error({err = 'RBINVAL id'}) end
  return v
end
local function rep(v)
  if OK[v] then return v end
  OK[v] = idok(v)
  return v
end
-- What every call starts with: the clock, the prefix, the limits.
local function open(cfg)
  local t = redis.call('TIME')
  local now = t[1] * 1000000 + t[2]
  local v = redis.call('HMGET', cfg, 'json', 'pc')
  local cap = CAPS[v[1]]
  if not cap then
    cap = cjson.decode(v[1]).InFlight.get
    CAPS[v[1]] = cap
  end
  local qu, rx, rc, lt, co, tl, ce = struct.unpack(PCF, v[2])
  if now < qu then error({err = 'quarantined'}) end
  if rc <= now then error({err = 'reclaim due'}) end
  if rx < now then error({err = 'config ttl due'}) end
  return now, string.sub(cfg, 1, -4), cap, ce
end
local function expat(now, idle)
  local t = now / 1000
  return string.format('%d', t - t % 1 + idle)
end
`

// leanKeys writes, under a budget of its own named name, what today's
// scripts would have left for a contended admission: the limits (one get
// slot), the domain's packed counts in domBytes bytes (the slot held, its
// queue flagged), the session live far ahead, and the holder's lease in
// today's lx (which layout 3 does not read). It returns the
// config's key and the holder's lease id.
func leanKeys(ctx context.Context, c *redis.Client, name, session string, domBytes int) (cfg, holder string, err error) {
	cfg = "rb:{" + hex.EncodeToString([]byte(name)) + "}:cfg"
	p := cfg[:len(cfg)-3]
	far := int64(1) << 60
	pc := make([]byte, 56) // qu, rx, rc, lt, co, tl, ce
	binary.BigEndian.PutUint64(pc[8:], uint64(far))
	binary.BigEndian.PutUint64(pc[16:], uint64(far))
	if err := c.HSet(ctx, cfg, "json", `{"InFlight":{"get":1}}`, "pc", string(pc)).Err(); err != nil {
		return "", "", err
	}
	// Version 2, queue flag 1, its TTL (rx) far ahead, class get (index 2)
	// at 1, and zeros past today's 176 bytes (layout 3's HOT block).
	dom := make([]byte, domBytes)
	binary.BigEndian.PutUint64(dom[0:], 2)
	binary.BigEndian.PutUint64(dom[8:], 1)
	binary.BigEndian.PutUint64(dom[64:], math.Float64bits(4e15))
	binary.BigEndian.PutUint64(dom[16*8+2*8:], 1)
	if err := c.Set(ctx, p+"d:"+leanEnc, dom, 0).Err(); err != nil {
		return "", "", err
	}
	if err := c.ZAdd(ctx, p+"sexp", redis.Z{Score: 4e15, Member: session}).Err(); err != nil {
		return "", "", err
	}
	b := []byte{1, 1, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0}
	for _, s := range []string{session, leanEnc, "callgrind"} {
		b = binary.BigEndian.AppendUint32(b, uint32(len(s)))
		b = append(b, s...)
	}
	holder = uuid.NewString()
	if err := c.HSet(ctx, p+"lx", holder, string(b)).Err(); err != nil {
		return "", "", err
	}
	return cfg, holder, nil
}
