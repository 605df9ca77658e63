package main

import (
	"context"
	"encoding/hex"
	"fmt"
	"strconv"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
)

// A sketch of another layout, counted beside the real scripts (-sketch):
// what a contended admission would cost Redis if a group kept its counts
// and queue position in one packed string (st) and its queue as one string
// of fixed-width entries (ql: the waiter's liveness deadline, id, channel
// and session), appended at a join and read by offset at a handoff, with
// leases in one hash. A join is TIME, GET, APPEND and SET; a handoff TIME,
// GET, HDEL, GETRANGE, HSET, PUBLISH and SET. Counted a second time with
// the least bookkeeping (books below: the limits and the group clock read,
// the waiter's session looked at), it still leaves out what the real
// scripts also do: argument checks, session writes and sets, reclaim, key
// TTLs, waiter renewals, multi-domain requests, rate. It is a yardstick for
// a redesign, not a budget (ids of up to 36 bytes, channels and sessions of
// up to 40): it answers how much of today's cost is the layout's and how
// much is the bookkeeping around it. -sketch counts a third admission
// beside these two: today's layout and commands with the Lua written flat
// (lean.go), and a fourth, layout 2's records with flat Lua (lean2.go).
const sketchLib = `#!lua name=rbsketch
local W = 127 -- bytes per queue entry (EFMT's size)
local EFMT = '>i8Bc36Bc40Bc40'
local function pad(s, n) return s .. string.rep(' ', n - #s) end
-- With ARGV[3] = 'b', each call also reads the limits and the group clock
-- as today's scripts do (HMGET of the config's json and pc, pc unpacked),
-- and a handoff looks at the waiter's session deadline (ZSCORE): the least
-- bookkeeping a real version would add.
local function books(KEYS, ARGV)
  if ARGV[3] ~= 'b' then return end
  local v = redis.call('HMGET', KEYS[1], 'json', 'pc')
  if v[2] then struct.unpack('>i8i8i8i8i8i8i8', v[2]) end
end
-- What both calls start with: the time, the key prefix, and the state
-- (slots in use, arrivals, the queue's head offset).
local function open(KEYS, ARGV)
  local t = redis.call('TIME')
  local p = string.sub(KEYS[1], 1, -4)
  books(KEYS, ARGV)
  local n, seq, off = struct.unpack('>i8i8i8', redis.call('GET', p .. 'st'))
  return tonumber(t[1]) * 1000000 + tonumber(t[2]), p, n, seq, off
end
redis.register_function('sketch_join', function(KEYS, ARGV)
  local now, p, n, seq, off = open(KEYS, ARGV)
  local wid, ch, sid = ARGV[4], ARGV[5], ARGV[6]
  local ttl = tonumber(ARGV[10]) * 1000
  redis.call('APPEND', p .. 'ql', struct.pack(EFMT, now + ttl, #wid, pad(wid, 36), #ch, pad(ch, 40), #sid, pad(sid, 40)))
  redis.call('SET', p .. 'st', struct.pack('>i8i8i8', n, seq + 1, off))
  return {'2'}
end)
redis.register_function('sketch_handoff', function(KEYS, ARGV)
  local now, p, n, seq, off = open(KEYS, ARGV)
  if redis.call('HDEL', p .. 'lx', ARGV[4]) == 1 then n = n - 1 end
  local e = redis.call('GETRANGE', p .. 'ql', off, off + W - 1)
  if #e == W then
    local dl, lw, wid, lc, ch, ls, sid = struct.unpack(EFMT, e)
    wid, ch, sid = string.sub(wid, 1, lw), string.sub(ch, 1, lc), string.sub(sid, 1, ls)
    off = off + W
    if ARGV[3] == 'b' and (tonumber(redis.call('ZSCORE', p .. 'sexp', sid)) or 0) <= now then dl = 0 end
    if dl > now then
      redis.call('HSET', p .. 'lx', wid, struct.pack('>i8c0', now, sid))
      n = n + 1
      redis.call('PUBLISH', p .. 'wake:' .. ch, 'granted ' .. wid .. ' ' .. sid .. ' 0')
    end
    if off >= 64 * W then -- compaction, amortized over 64 handoffs
      redis.call('SET', p .. 'ql', redis.call('GETRANGE', p .. 'ql', off, -1))
      off = 0
    end
  end
  redis.call('SET', p .. 'st', struct.pack('>i8i8i8', n, seq, off))
  return {'1'}
end)
`

// sketch counts a contended admission of the sketched layout: a join of a
// new waiter behind ahead others, and a handoff that retires the lease
// granted by the previous one and grants the head; with books, the least
// bookkeeping besides (sketchLib).
func sketch(ctx context.Context, c *redis.Client, ahead int, books bool, counted func(string, int, func() error) (float64, error)) (float64, error) {
	if err := c.FunctionLoadReplace(ctx, sketchLib).Err(); err != nil {
		return 0, err
	}
	name, clock := "cg-sketch", ""
	if books {
		name, clock = "cg-sketch-books", "b"
	}
	cfg := "rb:{" + hex.EncodeToString([]byte(name)) + "}:cfg"
	p := cfg[:len(cfg)-3]
	st := make([]byte, 24) // one slot in use, as the line's holder
	st[7] = 1
	if err := c.Set(ctx, p+"st", st, 0).Err(); err != nil {
		return 0, err
	}
	if books {
		lim := `{"InFlight":{"get":1}}`
		if err := c.HSet(ctx, cfg, "json", lim, "pc", string(make([]byte, 56))).Err(); err != nil {
			return 0, err
		}
		if err := c.ZAdd(ctx, p+"sexp", redis.Z{Score: 4e15, Member: sketchSession}).Err(); err != nil {
			return 0, err
		}
	}
	holder := uuid.NewString()
	if err := c.HSet(ctx, p+"lx", holder, "x").Err(); err != nil {
		return 0, err
	}
	common := []any{"PUBLISH", strconv.Itoa(20 * 3600 * 1000), clock}
	return countLine(name, ahead, holder, counted, func(id string) error {
		args := append(common[:3:3], id, "0123456789abcdef-chan", sketchSession, "0", "0", "callgrind",
			strconv.Itoa(3600*1000), "1", "1.6430")
		return c.FCall(ctx, "sketch_join", []string{cfg}, args...).Err()
	}, func(holder string) error {
		args := append(common[:3:3], holder, "1", "0123456789abcdef-chan")
		return c.FCall(ctx, "sketch_handoff", []string{cfg}, args...).Err()
	})
}

// countLine counts admissions of a sketched line on one slot, held by
// holder: ahead waiters join it first, then each admission counted is a
// join at the back and a handoff of the holder's slot to the head, which
// holds it next. Waiter ids are new uuids, as the store's are.
func countLine(name string, ahead int, holder string, counted func(string, int, func() error) (float64, error),
	join func(id string) error, handoff func(holder string) error) (float64, error) {
	var line []string
	add := func() error {
		id := uuid.NewString()
		line = append(line, id)
		return join(id)
	}
	for range ahead {
		if err := add(); err != nil {
			return 0, err
		}
	}
	return counted(name, 200, func() error {
		if err := add(); err != nil {
			return err
		}
		if err := handoff(holder); err != nil {
			return err
		}
		holder, line = line[0], line[1:]
		return nil
	})
}

const sketchSession = "0123456789abcdef-0123-sess"

func printSketch(bare, books, lean, lean2, admission, gcra float64) {
	fmt.Printf("  sketch (one packed state, one queue string): a contended admission %.0f (%.2f redis_rate Allows, %.0f%% of today's);\n",
		bare, bare/gcra, 100*bare/admission)
	fmt.Printf("    with the limits, the group clock and the waiter's session read: %.0f (%.2f Allows, %.0f%%)\n",
		books, books/gcra, 100*books/admission)
	fmt.Printf("  today's layout and commands with the Lua written flat (lean.go): %.0f (%.2f Allows, %.0f%%)\n",
		lean, lean/gcra, 100*lean/admission)
	fmt.Printf("  layout 2 (waiters in lx, liveness by session) with the Lua written flat (lean2.go): %.0f (%.2f Allows, %.0f%%)\n",
		lean2, lean2/gcra, 100*lean2/admission)
}

func printLean3(l3, l3z, joinCancel, join, admission, gcra float64) {
	fmt.Printf("  layout 3 (queue strings, liveness by session, leases by field) with the Lua written flat (lean3.go): %.0f (%.2f Allows, %.0f%%);\n",
		l3, l3/gcra, 100*l3/admission)
	fmt.Printf("    without its session cache: %.0f (%.2f Allows, %.0f%%); a cancel in the middle of a line of 64: %.0f (a join alone %.0f)\n",
		l3z, l3z/gcra, 100*l3z/admission, joinCancel-join, join)
}
