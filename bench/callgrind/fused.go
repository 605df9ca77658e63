package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/runbudget/runbudget/redisstore"
)

// The fifth yardstick (-sketch): the batched pair P3 runs under load (a
// lease's whole retirement, which hands its slot to the head of its
// queue, then a new waiter's join behind the next head) as one function
// of a copy of today's library, on today's layout and keys, calling
// lib.lua's own helpers (dload, q_head, q_pop, q_append, dsave, session,
// lease_put, epack, ...) in a straight line: no run_batch, one begin, no
// candidate list, no try_grant/decide/check around the grant, one save
// of the domain. It runs as a batch (begin's batched, then BATCH.flush),
// so the domain is written once and session deadlines are read once, as
// today's batch reads them. Where the pair is not the common case it answers with an
// error instead (this is a count, not a build): a rate, a throttle, a
// pause or a quarantine, several domains, a
// lease or head of another class, a next head that its ceiling does not
// hold back. What it writes is what today's batch writes for the same
// pair (TestFusedPairDoesWhatTheBatchDoes compares them), so its
// count says what a fused fast path for this pair would cost with
// today's helpers: between today's batch and layout 3's flat Lua.
const fusedBody = `
local lid = id_arg(ARGV[4], 'lease id')
local parts = int(ARGV[5], 'parts', 1, 3, true)
local lsid = id_arg(ARGV[6], 'session id', true)
local id = id_arg(ARGV[7], 'waiter id')
local ch = id_arg(ARGV[8], 'process channel', true)
local sid = id_arg(ARGV[9], 'session id', true)
local class = int(ARGV[10], 'class', 0, NCLASS - 1, true)
local body = int(ARGV[11], 'body flag', 0, 1, true)
local consumer = ARGV[12]
local ttl = int(ARGV[13], 'lease ttl', 1, 86400000, true) * 1000
local n = int(ARGV[14], 'domain count', 1, 1, true)
local enc = enc_arg(ARGV[15])
local now = clock()
local lim = lims()
if not lim or parts ~= 3 or lim.rps ~= 0 or now < lim.qu then
  error('fused: not the common case (limits)', 0)
end
vouch(lim, now, ttl)
touch_cfg(now)
reclaim(now)
local lk = lxkey(lsid)
local v = redis.call('HGET', lk, lid)
local l = v and lease_unpack(v)
if not l or l.hr ~= 1 or l.ds ~= enc then error('fused: not the common case (lease)', 0) end
local d = dload(enc)
local ci, cap = l.c + 1, lim.caps[l.c + 1]
if d.new or d.th == 1 or d.pu > now or d.bk == 1 then error('fused: not the common case (domain)', 0) end
local h = q_head(d)
if not h or h.ds ~= '' or h.c ~= l.c or h.b > l.hb then error('fused: not the common case (head)', 0) end
-- The lease's slots go back, and the head takes them.
if d.f[ci] > 0 then d.f[ci] = d.f[ci] - 1 end
if l.hb == 1 and d.b > 0 then d.b = d.b - 1 end
redis.call('HDEL', lk, lid)
local left = session(h.sid, h.ttl, now, true)
if not left or (cap > 0 and d.f[ci] >= cap) then error('fused: not the common case (grant)', 0) end
d.f[ci] = d.f[ci] + 1
if h.b == 1 then d.b = d.b + 1 end
if d.fs == 0 or now - d.sa >= START_MEMORY then d.fs, d.ss = now, 0 end
d.ss = decay(d.ss, (now - d.sa) / 1000000) + 1 / TAU
d.sa = now
q_pop(d, h, false)
local nh = q_head(d)
if nh and (nh.ds ~= '' or nh.c ~= l.c or not (cap > 0 and d.f[ci] >= cap)) then
  error('fused: not the common case (next head)', 0)
end
lease_put(h.sid, h.id, lease_pack(1, h.b, h.c, now, h.sid, enc, h.cs))
Q.tell_granted(h, left)
-- The new waiter joins behind the next head.
local wl = session(sid, ttl, now)
if not wl or not nh then error('fused: not the common case (join)', 0) end
local entry = epack(id, sid, ch, class, body, ttl, now, '', consumer)
local at = d.qb + d.ql
if not lease_put(sid, id, 'W' .. I(at) .. ' ' .. enc, false, true) then error('fused: not the common case (marker)', 0) end
if q_append(d, entry) ~= at then error('fused: not the common case (queue)', 0) end
dsave(d, now, lim)
BATCH.flush()
return {{R_OK}, {R_QUEUED, I(wl)}}
`

// fusedLib returns a copy of today's library under names of its own,
// with the fused pair registered as fused_pair.
func fusedLib() (string, error) {
	lib, err := libraryCopy("rbfused")
	if err != nil {
		return "", err
	}
	var b strings.Builder
	b.WriteString(lib)
	fmt.Fprintf(&b, "\nredis.register_function('fused_pair', function(KEYS, ARGV) begin(KEYS, ARGV, false, true)\n%s\nend)\n", fusedBody)
	return b.String(), nil
}

// fusedOp loads fusedLib on c and returns, on a contended line of its own
// on s (which must use c), one admission sent as the fused pair.
func fusedOp(ctx context.Context, c *redis.Client, s *redisstore.Store, ahead int) (func() error, error) {
	lib, err := fusedLib()
	if err != nil {
		return nil, err
	}
	if err := c.FunctionLoadReplace(ctx, lib).Err(); err != nil {
		return nil, fmt.Errorf("loading the fused library: %w", err)
	}
	l, acq, ret, err := capturedLine(ctx, c, s, ahead)
	if err != nil {
		return nil, err
	}
	racq, rret := acq[4:], ret[4:]
	return func() error {
		id := uuid.NewString()
		args := make([]any, 0, len(rret)+len(racq)-3)
		args = append(args, rret...)
		args[3] = l.holder // ARGV[4]: the lease id
		args = append(args, racq[3:]...)
		args[6] = id // ARGV[7]: the waiter id
		r, err := c.FCall(ctx, "fused_pair", []string{fmt.Sprint(acq[3])}, args...).Slice()
		if err != nil {
			return err
		}
		rr, ok1 := r[0].([]any)
		ar, ok2 := r[1].([]any)
		if len(r) != 2 || !ok1 || !ok2 || len(rr) == 0 || len(ar) == 0 || rr[0] != "1" || ar[0] != "2" {
			return fmt.Errorf("fused pair: %v; want done and queued", r)
		}
		l.holder, l.waiters = l.waiters[0], append(l.waiters[1:], id)
		return nil
	}, nil
}
