package main

import (
	"context"
	"encoding/hex"
	"fmt"
	"strconv"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
)

// The fourth yardstick (-sketch): layout 3, the sketch's records with the
// bookkeeping a real version needs, in Lua as flat as lean.go's. Against
// today's layout:
//
//   - a domain's queue is one string of fixed-width entries (W bytes: the
//     arrival, a flag, class and body, the waiter's id, session and
//     consumer), appended at a join and read from a head offset kept in
//     the domain's packed value. Entries of one queue are in the order
//     their scripts ran, and a multi-domain join appends to each of its
//     queues in one script, so that order is one total order over every
//     queue without a ticket; the entry is the waiter's record, so there
//     is no w: key, no wexp and no ZADD or ZREM;
//
//   - a join whose APPEND finds entries ahead (the string was longer than
//     its own entry: a queue emptied is deleted) is blocked by FIFO and
//     reads nothing else of the domain; only one alone in line loads it;
//
//   - a waiter's liveness is its session's, and the library keeps the
//     deadlines of the sessions it read (a deadline only moves on, and a
//     session ends before it only by an operator's drop, which changes a
//     generation in pc that clears the cache), so the ZSCORE is sent only
//     when the known deadline has passed;
//
//   - the leases of a session are one hash, lx:<session>, whose field names
//     a lease by id, class and body, and domains: the retire's one HDEL
//     finds, checks and drops it (no HGET of a record, no session set to
//     keep: reclaim takes a dead session's fields a few at a time);
//
//   - a cancel finds its entry by binary search on the arrival its join
//     returned (GETRANGEs of 8 bytes) and marks it, and the handoff skips
//     marked entries and entries of dead sessions at the head;
//
//   - a domain's value is read by offset, only the fields a path uses, and
//     written by SETRANGE, only what changed: a handoff to the retired
//     lease's own class changes no count, only the block at the end
//     holding the queue's head and the start rate.
//
// A join behind a head is then 3 commands (TIME, HMGET, APPEND) and a
// handoff 8 (TIME, HMGET, HDEL, GET, GETRANGE, HSET, SETRANGE, PUBLISH)
// with the sessions known; with the cache off (lean3_mode z), one ZSCORE
// more each.
// It leaves out what lean.go leaves out, and besides the real version's
// answers to entries wider than W (a record of their own) and to the
// multi-domain head check, so it is a floor for layout 3, not a build.
const lean3Lib = `#!lua name=rblean3
` + leanPrelude + `-- A domain's value is today's fields (DF), then the block a handoff
-- changes, HOT: its queue's head offset and marked entries, and the start
-- rate (which stands in for today's ss and sa, unused here).
local HOT = '>i8i8dd'
local W = 128
local EF = '>i8BBBBc0Bc0Bc0'
-- (A library's load runs without the string library: PAD fills on use.)
local PAD = {}
local CBS = {[0] = '0', '1', '2', '3', '4', '5', '6', '7', '8', '9', '10', '11'}
local CBN = {}
for i = 0, 11 do CBN[CBS[i]] = i end
local SD, LT, GEN, NC = {}, {}, nil, false
redis.register_function('lean3_mode', function(KEYS, ARGV)
  NC = ARGV[1] == 'z'
  SD = {}
  return 'ok'
end)
-- The deadline of session sid, from the cache when it has not passed.
local function alive(p, sid, now)
  local sd = SD[sid]
  if NC or not (sd and sd > now) then
    sd = tonumber(redis.call('ZSCORE', p .. 'sexp', sid))
    SD[sid] = sd
  end
  return sd and sd > now and sd
end
local function opened(cfg)
  local now, p, cap, gen = open(cfg)
  if gen ~= GEN then SD, LT, GEN = {}, {}, gen end
  return now, p, cap
end
local function join(KEYS, ARGV, now, p, cap)
  local id, sid = idok(ARGV[4]), rep(ARGV[6])
  local class, body, consumer = tonumber(ARGV[7]), tonumber(ARGV[8]), ARGV[9]
  local idle, enc = tonumber(ARGV[2]), rep(ARGV[12])
  if not alive(p, sid, now) then return {'5'} end
  local q = p .. 'q:' .. enc
  local e = struct.pack(EF, now, 0, class, body, #id, id, #sid, sid, #consumer, consumer)
  if #e > W then error({err = 'RBINVAL entry too wide'}) end
  local pad = PAD[W - #e]
  if not pad then
    pad = string.rep('\0', W - #e)
    PAD[W - #e] = pad
  end
  local len = redis.call('APPEND', q, e .. pad)
  if len == W then
    -- Alone in line: the domain decides. (Here it is always full: the
    -- yardstick's one slot is held.) The queue takes the domain's TTL.
    local dk = p .. 'd:' .. enc
    local d = redis.call('GET', dk)
    if struct.unpack('>i8', d, 129 + 8 * class) < cap then error({err = 'the yardstick grants nobody at once'}) end
    redis.call('PEXPIREAT', q, expat(now, idle))
    redis.call('SETRANGE', dk, 8, struct.pack('>i8', 1))
    redis.call('SETRANGE', dk, 176, struct.pack('>i8i8', 0, 0))
  end
  return {'2', now} -- an integer: exact as a reply
end
local function handoff(KEYS, ARGV, now, p, cap)
  local lid, parts, lsid, cb, enc = idok(ARGV[4]), tonumber(ARGV[5]), rep(ARGV[6]), CBN[ARGV[7]], rep(ARGV[8])
  local idle = tonumber(ARGV[2])
  -- The field names the lease: its one HDEL finds it, checks its class
  -- and domains, and drops it.
  if redis.call('HDEL', p .. 'lx:' .. lsid, lid .. '|' .. ARGV[7] .. '|' .. enc) == 0 then return {'1'} end
  local dk, q = p .. 'd:' .. enc, p .. 'q:' .. enc
  -- The domain's value is read by offset, only the fields this path
  -- uses: its queue flag and TTL, the count of the lease's class, and
  -- the block a handoff changes (HOT).
  local d = redis.call('GET', dk)
  local qf, rx = struct.unpack('>i8', d, 9), struct.unpack('>d', d, 65)
  if rx < now then error({err = 'domain ttl due'}) end
  local ci = (cb - cb % 2) / 2
  local fc0 = struct.unpack('>i8', d, 129 + 8 * ci)
  local fc = fc0
  if parts % 2 == 1 and fc > 0 then fc = fc - 1 end
  local qh, qt, ss, sa = struct.unpack(HOT, d, 177)
  local nxt, oc, ocn
  if qf == 1 then
    -- The head and the next entry in one read; marked entries and those
    -- of dead sessions are passed (the real script reads on past two).
    local e = redis.call('GETRANGE', q, qh, qh + 2 * W - 1)
    local n, k = #e / W, 0
    while k < n do
      local at, fl, wc, wb, wid, wsid, wcs = struct.unpack(EF, e, k * W + 1)
      local sd = fl == 0 and alive(p, wsid, now)
      if sd then
        -- The head's class count: the lease's own (the usual case, and
        -- then -1 +1 leaves it as stored), or another's, read here.
        local wf = fc
        if wc ~= ci then wf = struct.unpack('>i8', d, 129 + 8 * wc) end
        if wf >= cap then break end
        if wc == ci then fc = fc + 1 else oc, ocn = wc, wf + 1 end
        local x = (now - sa) / 2000000
        if x > 0 then ss = ss * math.exp(-x) end
        ss, sa = ss + 0.5, now
        local lk = p .. 'lx:' .. wsid
        redis.call('HSET', lk, wid .. '|' .. CBS[wc * 2 + wb] .. '|' .. enc, struct.pack('>i8I4c0', now, #wcs, wcs))
        local lt = LT[lk]
        if not lt or lt < now then
          redis.call('PEXPIREAT', lk, expat(now, idle))
          LT[lk] = now + idle * 500
        end
        redis.call('PUBLISH', p .. 'wake:' .. string.sub(wsid, 1, 36), 'granted ' .. wid .. ' ' .. wsid .. ' ' .. string.format('%d', sd - now))
        k = k + 1
        if k < n then
          local nat, nfl, nc, nb, nid = struct.unpack(EF, e, k * W + 1)
          -- The next one's class count as it now stands.
          local nf = fc
          if nc == oc then nf = ocn elseif nc ~= ci then nf = struct.unpack('>i8', d, 129 + 8 * nc) end
          if nfl == 0 and nf < cap then nxt = nid end
        end
        break
      end
      if fl == 1 then qt = qt - 1 end
      k = k + 1
    end
    qh = qh + k * W
    if k == n and n < 2 then
      redis.call('DEL', q)
      qh, qt = 0, 0
      redis.call('SETRANGE', dk, 8, struct.pack('>i8', 0))
    elseif qh >= 64 * W then
      -- Compaction, once per 64 entries passed.
      redis.call('SET', q, redis.call('GETRANGE', q, qh, -1), 'KEEPTTL')
      qh = 0
    end
  end
  -- Only what changed is written, each with one SETRANGE (which keeps the
  -- key's TTL): a handoff to the lease's own class changes no count.
  if fc ~= fc0 then redis.call('SETRANGE', dk, 128 + 8 * ci, struct.pack('>i8', fc)) end
  if oc then redis.call('SETRANGE', dk, 128 + 8 * oc, struct.pack('>i8', ocn)) end
  redis.call('SETRANGE', dk, 176, struct.pack(HOT, qh, qt, ss, sa))
  if nxt then return {'1', nxt} end
  return {'1'}
end
local function cancel(KEYS, ARGV, now, p, cap)
  local id, at, enc = idok(ARGV[4]), tonumber(ARGV[5]), rep(ARGV[8])
  local dk, q = p .. 'd:' .. enc, p .. 'q:' .. enc
  local qh, qt = struct.unpack('>i8i8', redis.call('GETRANGE', dk, 176, 191))
  local n = (redis.call('STRLEN', q) - qh) / W
  -- The first entry that arrived no earlier than at, by its arrival alone.
  local lo, hi = 0, n
  while lo < hi do
    local mid = (lo + hi - (lo + hi) % 2) / 2
    local off = qh + mid * W
    if struct.unpack('>i8', redis.call('GETRANGE', q, off, off + 7)) < at then lo = mid + 1 else hi = mid end
  end
  -- Entries of one arrival (one batch's joins) are few: the id decides.
  while lo < n do
    local off = qh + lo * W
    local t, fl, wc, wb, wid = struct.unpack(EF, redis.call('GETRANGE', q, off, off + W - 1))
    if t ~= at then break end
    if wid == id then
      if fl ~= 0 then break end
      -- At the head the real script passes it and tries the next, as a
      -- handoff does; the yardstick cancels behind the head.
      if lo == 0 then error({err = 'the yardstick cancels behind the head'}) end
      redis.call('SETRANGE', q, off + 8, '\1')
      redis.call('SETRANGE', dk, 184, struct.pack('>i8', qt + 1))
      return {'1'}
    end
    lo = lo + 1
  end
  return {'0'}
end
redis.register_function('lean3_join', function(KEYS, ARGV) return join(KEYS, ARGV, opened(KEYS[1])) end)
redis.register_function('lean3_handoff', function(KEYS, ARGV) return handoff(KEYS, ARGV, opened(KEYS[1])) end)
redis.register_function('lean3_cancel', function(KEYS, ARGV) return cancel(KEYS, ARGV, opened(KEYS[1])) end)
-- A lane's release and its next acquire in one call, as group commit
-- sends them: the handoff's arguments (4-8), then the join's own (9-17);
-- the time and the limits are read once.
redis.register_function('lean3_pair', function(KEYS, ARGV)
  local now, p, cap = opened(KEYS[1])
  local h = handoff(KEYS, ARGV, now, p, cap)
  local a = {ARGV[1], ARGV[2], ARGV[3]}
  for j = 9, #ARGV do a[#a + 1] = ARGV[j] end
  return {h, join(KEYS, a, now, p, cap)}
end)
`

// lean3 is one budget of the layout-3 yardstick, on keys of its own.
type lean3 struct {
	ctx          context.Context
	c            *redis.Client
	cfg, session string
	idle         string
}

const lean3Session = "7d0f1e3a-5b2c-4d6e-8f90-a1b2c3d4e5f6.0"

// newLean3 loads lean3Lib (with the session cache on, or off when
// nocache) and writes what a contended admission finds: the limits (one
// get slot), the domain's packed counts with the slot held and an empty
// queue, the session live far ahead, and the holder's lease. It returns
// the budget and the holder's lease id.
func newLean3(ctx context.Context, c *redis.Client, name string, nocache bool) (*lean3, string, error) {
	if err := c.FunctionLoadReplace(ctx, lean3Lib).Err(); err != nil {
		return nil, "", err
	}
	mode := ""
	if nocache {
		mode = "z"
	}
	if err := c.FCall(ctx, "lean3_mode", nil, mode).Err(); err != nil {
		return nil, "", err
	}
	cfg, _, err := leanKeys(ctx, c, name, lean3Session, 176+32) // today's fields, then HOT
	if err != nil {
		return nil, "", err
	}
	p := cfg[:len(cfg)-3]
	holder := uuid.NewString()
	if err := c.HSet(ctx, p+"lx:"+lean3Session, holder+"|4|"+leanEnc, string(make([]byte, 8))).Err(); err != nil {
		return nil, "", err
	}
	return &lean3{ctx: ctx, c: c, cfg: cfg, session: lean3Session, idle: strconv.Itoa(20 * 3600 * 1000)}, holder, nil
}

// join queues waiter id (class get, no body) and returns its arrival.
func (l *lean3) join(id string) (string, error) {
	r, err := l.c.FCall(l.ctx, "lean3_join", []string{l.cfg}, "PUBLISH", l.idle, "", id, "", l.session,
		"2", "0", "callgrind", strconv.Itoa(3600*1000), "1", leanEnc).Slice()
	if err != nil {
		return "", err
	}
	if len(r) != 2 || r[0] != "2" {
		return "", fmt.Errorf("lean3 join: %v, want queued", r)
	}
	at, ok := r[1].(int64)
	if !ok {
		return "", fmt.Errorf("lean3 join: arrival %v, want an integer", r[1])
	}
	return strconv.FormatInt(at, 10), nil
}

// handoff retires lease lid, handing its slot to the head.
func (l *lean3) handoff(lid string) error {
	return l.c.FCall(l.ctx, "lean3_handoff", []string{l.cfg}, "PUBLISH", l.idle, "", lid, "3", l.session, "4", leanEnc).Err()
}

// cancel takes waiter id, which arrived at, out of the line.
func (l *lean3) cancel(id, at string) error {
	r, err := l.c.FCall(l.ctx, "lean3_cancel", []string{l.cfg}, "PUBLISH", l.idle, "", id, at, l.session, "4", leanEnc).StringSlice()
	if err != nil {
		return err
	}
	if len(r) != 1 || r[0] != "1" {
		return fmt.Errorf("lean3 cancel of %s: %q, want cancelled", id, r)
	}
	return nil
}

// pair retires lease lid and queues waiter id in one call (lean3_pair).
func (l *lean3) pair(lid, id string) error {
	r, err := l.c.FCall(l.ctx, "lean3_pair", []string{l.cfg}, "PUBLISH", l.idle, "", lid, "3", l.session, "4", leanEnc,
		id, "", l.session, "2", "0", "callgrind", strconv.Itoa(3600*1000), "1", leanEnc).Slice()
	if err != nil {
		return err
	}
	if len(r) != 2 {
		return fmt.Errorf("lean3 pair: %v, want two replies", r)
	}
	if j, ok := r[1].([]any); !ok || len(j) != 2 || j[0] != "2" {
		return fmt.Errorf("lean3 pair: the join answered %v, want queued", r[1])
	}
	return nil
}

// lean3Batched counts a contended admission of layout 3 sent as group
// commit sends a lane's release and its next acquire: one call carrying
// the handoff and then the join, on a line of ahead waiters.
func lean3Batched(ctx context.Context, c *redis.Client, ahead int, counted func(string, int, func() error) (float64, error)) (float64, error) {
	l, holder, err := newLean3(ctx, c, "cg-lean3-pair", false)
	if err != nil {
		return 0, err
	}
	var line []string
	for range ahead {
		id := uuid.NewString()
		if _, err := l.join(id); err != nil {
			return 0, err
		}
		line = append(line, id)
	}
	return counted("lean3-pair", 200, func() error {
		id := uuid.NewString()
		if err := l.pair(holder, id); err != nil {
			return err
		}
		holder, line = line[0], append(line[1:], id)
		return nil
	})
}

// lean3Admission counts a contended admission of layout 3 in the setting
// the other yardsticks use (one slot held, ahead waiters behind it).
func lean3Admission(ctx context.Context, c *redis.Client, ahead int, nocache bool, counted func(string, int, func() error) (float64, error)) (float64, error) {
	name := lean3Name(nocache)
	l, holder, err := newLean3(ctx, c, name, nocache)
	if err != nil {
		return 0, err
	}
	return countLine(name, ahead, holder, counted, func(id string) error {
		_, err := l.join(id)
		return err
	}, l.handoff)
}

// lean3Cancel counts, on a line of ahead waiters that nobody leaves but by
// cancelling, a join at the back and the cancel of the waiter then in the
// middle of the line (found among every entry its queue still holds,
// marked ones too), and a join alone; the difference is the cancel's.
func lean3Cancel(ctx context.Context, c *redis.Client, ahead int, counted func(string, int, func() error) (float64, error)) (joinCancel, join float64, err error) {
	l, _, err := newLean3(ctx, c, "cg-lean3-cancel", false)
	if err != nil {
		return 0, 0, err
	}
	type waiter struct{ id, at string }
	var line []waiter
	add := func() error {
		id := uuid.NewString()
		at, err := l.join(id)
		line = append(line, waiter{id, at})
		return err
	}
	for range ahead {
		if err := add(); err != nil {
			return 0, 0, err
		}
	}
	if joinCancel, err = counted("lean3-cancel", 200, func() error {
		if err := add(); err != nil {
			return err
		}
		m := len(line) / 2
		w := line[m]
		line = append(line[:m], line[m+1:]...)
		return l.cancel(w.id, w.at)
	}); err != nil {
		return 0, 0, err
	}
	j, _, err := newLean3(ctx, c, "cg-lean3-joins", false)
	if err != nil {
		return 0, 0, err
	}
	join, err = counted("lean3-join", 200, func() error {
		_, err := j.join(uuid.NewString())
		return err
	})
	return joinCancel, join, err
}

// lean3Name names the budget of lean3Admission.
func lean3Name(nocache bool) string {
	if nocache {
		return "cg-lean3-z"
	}
	return "cg-lean3"
}

// lean3Prefix is the key prefix of the yardstick's budget name.
func lean3Prefix(name string) string { return "rb:{" + hex.EncodeToString([]byte(name)) + "}:" }
