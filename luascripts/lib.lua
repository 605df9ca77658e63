-- lib.lua: helpers shared by the budget scripts. Source() prepends this file
-- to every script whose first line is "-- uses: lib.lua", and the script
-- starts by calling begin(KEYS, ARGV); Library() instead builds one Redis
-- function library of this file and every such script, each a function
-- that calls begin first. Nothing here may touch KEYS, ARGV or Redis
-- outside a function: in a library this part runs once, at load time, and
-- the state of one call (CFG ... CANDS below) is set afresh by begin (the
-- operations of one batch may share the limits, domains and time: see
-- begin and batch.lua).
--
-- Conventions of every budget script:
--   KEYS[1]  the budget's config hash, "rb:{<hex name>}:cfg". Every other key
--            is built from its prefix and so shares its hash tag (one slot).
--   ARGV[1]  "PUBLISH" or "SPUBLISH" (sharded pub/sub on Redis Cluster), used
--            for wake events.
--   ARGV[2]  idle TTL in ms: how long a key lives after it was last touched.
--   ARGV[3]  the clock: "" to use Redis TIME (production always sends ""),
--            or a decimal count of microseconds since the Unix epoch that
--            the call takes as Redis TIME instead. Tests step it to drive
--            buckets, pauses and expiry without waiting, and to jump it.
--            Either way the call's now is the group clock built on it (see
--            Clock jumps below), and key TTLs follow it as given.
--   ARGV[4…] the script's own arguments.
-- Every reply is a list of strings whose first field is a reply code, one
-- of the R_ constants below (redisstore mirrors them by name). Numbers go
-- back to the client as strings, since Redis truncates a fractional Lua
-- number reply to an integer. A malformed argument raises an error reply
-- starting with "RBINVAL" before anything is written.
--
-- Key layout under the prefix P:
--   cfg          hash: limits (json, rps, burst, c0..c<NCLASS-1>, bodies),
--                epoch, qu (quarantine end after a state loss), rid (the
--                Redis run_id that wrote it), rx (when its TTL runs out,
--                by Redis TIME, us), rc (a time no later than the earliest
--                deadline in sexp: when reclaim is due), lt and co (the
--                group clock: the latest time it read, and its offset from
--                Redis TIME, us), tl (the longest lease TTL registered,
--                us), ce (the epoch the domains' counts must be of), ly
--                (the layout of the budget's keys, absent for 1: see
--                LAYOUT; this build's is 3)
--   d:<enc>      string: one domain's counts, bucket, throttle, start rate,
--                ep (the epoch of its counts), rx (when its TTL runs out,
--                by Redis TIME, us) and its queue's account (live waiters,
--                where the line starts, the string's length), packed in
--                one value (see DFIX; internal/dompack reads it in Go). A
--                build before this one kept a hash of the same fields
--                here: it is converted where found.
--   q:<enc>      string: the waiters of a domain, one entry after another
--                in arrival order (see Queues); its TTL follows the
--                domain's (qexpire)
--   doms         zset: domain encodings, scored by when their TTL was last
--                set (for Usage)
--   lx:<ce>:<sid>  hash: the leases of session sid, id -> packed record
--                (see lease_pack), the markers of its queued waiters, id ->
--                "W<places> <domains>" (see Queues), and an empty field
--                made with the key (grant); <ce> is the config's ce in decimal, so a new
--                epoch that wipes the counts leaves every record of the
--                old one behind unread, to expire (see lxkey)
--   sexp         zset: session id -> deadline (us)
--   sd:<sid>     set: ids of session sid's leases that an operator dropped,
--                until its holder's heartbeat has acknowledged them
--   sgone        zset: session id -> when reclaim ended it (us), for an
--                idle TTL: a session named there is never renewed or
--                created again, only re-asserted after a state loss
--   wake:<proc>  pub/sub channel of one process; messages are waiter ids
-- <enc> is "<version>.<hex of the ID bytes>", injective and free of braces.
-- Memory is not here: each host keeps its own memory line (budget/memory.go),
-- and the scripts never see a request's memory.
--
-- Sessions. A lease has no deadline of its own: it belongs to a session,
-- one per process and group, named by the process (its channel and a
-- generation), and lives as long as the session does. A heartbeat renews
-- the session with a few commands however many leases it holds. A session
-- is created by the first grant (or re-assertion) that names it, and a
-- grant that finds less than two thirds of a TTL left extends it (a
-- handoff no further than the waiter's own liveness deadline), so a
-- lease granted to a live process starts with that much. Once its
-- deadline has passed it is dead for good: no grant joins it and no beat
-- renews it (the holder hears R_SESSION_GONE and starts a new
-- generation), and reclaim retires its leases, RECLAIM per script, then
-- ends it in sgone.
--
-- Clock jumps. Every time a script stores (bucket refills, pauses,
-- throttles, deadlines) is read against later calls' now, so a step of
-- Redis TIME would move them all at once: back by minutes, a bucket stops
-- refilling and every deadline and pause lies minutes ahead; forward,
-- every session's deadline passes together and reclaim would give live
-- holders' slots to others while they still hold them. So a call's now is
-- a group clock, Redis TIME plus an offset (cfg co), checked against the
-- latest time the group read (cfg lt, kept within STEP):
--   - earlier than lt: TIME went back. The offset grows by the difference,
--     and the group's time goes on from lt as if nothing had happened. The
--     next call renews the config's TTL with the keys it vouches for
--     (touch_cfg); this one may have started before the step (expire).
--   - more than J past lt (half the longest lease TTL), with leases held:
--     every live holder beats at least every third of a TTL, so nobody
--     was heard from in two thirds of the time they beat in. Either every
--     holder died or was cut off (their sessions may expire), or TIME
--     jumped. It cannot be told from Redis, so the group's time advances
--     by J only: a jump costs no live holder its session (its next beat
--     comes less than two thirds of a TTL after its last), and a real
--     silence delays reclaim by at most TTL - J. A server whose run_id
--     changed (a restart or failover: real time passed, which its INFO
--     says) is taken at its word. A smaller jump needs nothing: it passes
--     no deadline a beat would not have renewed first.
--   - at least KEYRISK past lt, with leases held: key TTLs follow Redis's
--     wall clock, which jumped too, and some keys may have expired while
--     others lived (a domain's counts and not its leases, say). The group
--     starts a new epoch under quarantine, wiping lease records and
--     queues, and counts from an earlier epoch read as zero (d ep against
--     cfg ce): holders re-assert what they hold, so counts are rebuilt from
--     them, whatever survived.
-- Nothing jumps without leases held: a bucket may fill and a pause end
-- early, as after a real wait, but no count can be wrong. Key TTLs are
-- tracked in Redis TIME (rx), the clock that expires them.
--
-- Cost matters: on a loaded machine every command inside a script costs a
-- microsecond or more, and every string formatted or table built a fraction
-- of one, on every admission. So TTLs of the config and domain keys are
-- renewed only when half spent (their rx field says when they run out),
-- and the keys that live beside them with them (a queue with its domain,
-- sexp and the sessions' hashes with the config, a session's leases by its
-- heartbeats),
-- reclaim scans only when a deadline may have passed (rc), a domain is one
-- value read with one GET and written only when it changed, a queue is
-- looked at only when its domain says it holds waiters, a waiter that
-- joins behind another takes its place with one BITFIELD on its domain and
-- does not unpack it, and a call loads a domain once.

-- NCLASS, the number of operation classes, is defined by the line Source
-- and Library put before this file, from budget's one table of classes: a
-- class is its index there, 0 .. NCLASS-1, and nothing here names one.
-- CAPF are the config's ceiling fields by class index (Lua lists start at
-- 1: class c is entry c+1, in a domain's counts d.f too).
local CAPF = {}
for c = 0, NCLASS - 1 do
  CAPF[c + 1] = 'c' .. c
end

-- Reply codes, the first field of every reply. Their values are the wire
-- format: redisstore decodes them by the same names (replies.go), so change
-- both together. Scripts that only succeed or report a missing budget
-- answer R_OK or R_UNREGISTERED.
local R_OK = '1'           -- done; any further fields are the script's result
local R_GRANTED = '1'      -- acquire: granted, then the grant's age in us
local R_QUEUED = '2'       -- acquire: queued; wait for a wake event
local R_DELAYED = '3'      -- acquire: held back by time, then the wait in us
local R_UNREGISTERED = '-2' -- the budget's config is missing (never made, or lost)
local R_CONFLICT = '-3'    -- register: other limits are stored, then their JSON
local R_NEW_EPOCH = '-3'   -- heartbeat: the budget's epoch changed, then the new one
local R_NO_STATE = '0'     -- reset: the domain had no state
local R_SESSION_GONE = '-4' -- acquire, heartbeat: the session named is dead
-- The replies that are a code alone, made once: Redis only reads a reply.
local REPLY_OK, REPLY_QUEUED = {R_OK}, {R_QUEUED}

-- Per-call state, set by begin.
local CFG, P, PUB, IDLE -- config key, key prefix, publish command, idle TTL (ms)
local K                -- the prefix's busiest keys (sexp; lxkey's too), built once in a library
local NOW, LIM, CANDS   -- the call's group time, limits, handoff candidates
local PENDING           -- the candidates not yet tried, as a set
local HEADS             -- queue key -> its head as this call knows it (false: empty)
local QBUF              -- queue key -> {from = offset, s = bytes}: what this call read of it (q_at)
local LATE              -- domains a retirement left to save when the call ends (done; made on first use)
local RAW               -- the call's Redis TIME (or the clock given), us
local REAL              -- Redis's own TIME, us: RAW unless a clock was given
local BACK              -- how far TIME went back, as this call found (us)
local GIVEN             -- whether ARGV[3] gave the clock
local DC                -- domains loaded by this call, by encoding
-- What a batch's operations share beyond the domains and queue heads
-- they read (begin): on while a batch runs; pend, the domains whose
-- writes wait for its end, in the order first saved (dsave, BATCH.flush);
-- sx, session deadlines read or written (session). A table, not locals:
-- a chunk may have 200 locals in all.
local BATCH = {on = false, pend = {}, sx = {}}
local STRUCT            -- the struct library, nil where there is none
local NLREC, NEREC      -- lease records and queue entries unpacked so far (REUSE)
local EXPMS, EXPS       -- the last TTL a key was renewed for, and its PXAT argument (expiry_arg)

-- Lease record and queue entry tables are reused, as domain tables are
-- (DPOOL, below), but by position: the n-th record a call unpacks fills
-- the table the n-th of the previous call filled. No record outlives its call, so within a
-- call every record is a table of its own. Only the first RECS_MAX of a call are kept: a scan of thousands
-- (inspect) must not leave thousands of tables behind. REUSE also holds
-- the request and domain lists that try_grant and acquire refill (see
-- try_grant); one table, since a script may have 200 locals in all.
local RECS_MAX = 16
local REUSE = {lrecs = {}, erecs = {}, adoms = {}, hdoms = {}}
do
  -- acquire's request and try_grant's, each with every field a request has
  -- (refills then find their slots; see DPOOL).
  local reqs = {'areq', 'hreq'}
  for i = 1, #reqs do
    REUSE[reqs[i]] = {id = false, encs = false, class = false, body = false, consumer = false,
      ch = false, ttl = false, sid = false, handoff = false, queued = false, left = false}
  end
end

-- Set once, at load, by a function library (see LCACHE below).
local IN_LIBRARY = false

local function bad(msg)
  error({err = 'RBINVAL ' .. msg})
end

-- Arguments that repeat from call to call (a class, a TTL, a domain's
-- encoding, a process's channel) are checked once in a library, where a
-- check asks for it: PASSED maps a check's name to its bounds and the
-- values that passed it, with what they gave. A value that passed a check
-- with the same bounds passes again. Bounded like LCACHE.
local PASSED, NPASSED = {}, 0
local PASSED_MAX = 4096

local function passed(name, v, n, lo, hi)
  if not IN_LIBRARY then return n end
  if NPASSED >= PASSED_MAX then PASSED, NPASSED = {}, 0 end
  local t = PASSED[name]
  if not t or t.lo ~= lo or t.hi ~= hi then
    t = {lo = lo, hi = hi, v = {}}
    PASSED[name] = t
  end
  t.v[v] = n
  NPASSED = NPASSED + 1
  return n
end

-- Strict decimal integer in [lo, hi]. tonumber alone would accept hex,
-- padding, "nan" and "inf"; a NaN must never reach a comparison. repeats
-- says the value comes again on later calls: worth remembering.
local function int(v, name, lo, hi, repeats)
  if repeats then
    -- What passed before: looked up here, not in a helper, since this
    -- runs for most arguments of every call (a Lua call costs too).
    local t = PASSED[name]
    if t and t.lo == lo and t.hi == hi then
      local n = t.v[v]
      if n then return n end
    end
  end
  if type(v) ~= 'string' or #v > 17 or not string.find(v, '^%-?%d+$') then
    bad(name .. ' is not a decimal integer')
  end
  local n = tonumber(v)
  if n == nil or n ~= n or n < lo or n > hi then
    bad(name .. ' is out of range')
  end
  if repeats then return passed(name, v, n, lo, hi) end
  return n
end

-- Strict non-negative decimal with an optional fraction, no exponent.
local function dec(v, name, hi)
  if type(v) ~= 'string' or #v > 40 or not (string.match(v, '^%d+%.?%d*$') or string.match(v, '^%d+%.?%d*e[-+]?%d+$')) then
    bad(name .. ' is not a decimal number')
  end
  local n = tonumber(v)
  if n == nil or n ~= n or n > hi then
    bad(name .. ' is out of range')
  end
  return n
end

local function enc_arg(v)
  local t = PASSED['domain encoding'] -- passed before (see int)
  if t and t.lo == 0 and t.hi == 0 and t.v[v] then return v end
  if type(v) ~= 'string' or not string.find(v, '^%-?%d+%.%x+$') then
    bad('domain encoding is malformed')
  end
  return passed('domain encoding', v, v, 0, 0)
end

-- The domain encodings of a record, joined by commas, as a list. A C
-- function costs about 900 instructions a call here against about 45 for a
-- VM instruction, and gmatch calls one per element and one more: a single
-- domain, the common case, takes one plain find. For the same reason hot
-- loops count over arrays instead of calling ipairs' iterator, and floor
-- and min are written as arithmetic.
-- A library keeps the lists it made, by the string split (bounded like
-- PASSED): the same domains come back on every record of a lane, and no
-- caller changes a list it gets.
local SPLIT, NSPLIT = {}, 0
local function split_encs(ds)
  local out = SPLIT[ds]
  if out then return out end
  if not string.find(ds, ',', 1, true) then
    out = {ds}
  else
    out = {}
    for e in string.gmatch(ds, '[^,]+') do out[#out + 1] = e end
  end
  if IN_LIBRARY then
    if NSPLIT >= PASSED_MAX then SPLIT, NSPLIT = {}, 0 end
    SPLIT[ds], NSPLIT = out, NSPLIT + 1
  end
  return out
end

-- repeats as for int: a process's channel or session, not a waiter's id.
-- An argument is a string or missing (nil): no type() for it, a C call.
local function id_arg(v, name, repeats)
  if repeats then
    local t = PASSED[name] -- passed before (see int)
    if t and t.lo == 0 and t.hi == 0 and t.v[v] then return v end
  end
  -- Anchored: one match over the string, where an unanchored '%s' is
  -- tried from every position (3k instructions against 5.6k, a uuid).
  if not v or #v > 200 or not string.find(v, '^%S+$') then
    bad(name .. ' is malformed')
  end
  if repeats then return passed(name, v, v, 0, 0) end
  return v
end

-- keep is set by a batch (batch.lua) for an operation that follows one
-- that ended without an error, with the same common arguments: the limits
-- and domains the previous one loaded, and its time, serve this one too.
-- They are what Redis holds, or what this one would compute again at the
-- same instant (a bucket refilled and not written), since every write of
-- these scripts to the config and to a loaded domain goes through those
-- tables (a retirement's BITFIELD, and a join's, touch only domains not
-- loaded); reading them again is most of what a batch saves. So do the
-- queue heads and bytes read (HEADS, QBUF), which every write to a queue
-- keeps up to date, and the entry tables they hold (REUSE numbering goes
-- on).
--
-- batched is set for every operation of a batch: its domain writes wait
-- for the batch's end (dsave, BATCH.flush), begin writes those waiting
-- before it lets the loaded domains go, and session deadlines are shared
-- as the domains are (BATCH.sx).
local PFX, NPFX = {}, 0 -- config key -> its prefix and busiest keys, for keys checked (a library's)
local function begin(keys, argv, keep, batched)
  if keep then
    -- The batch's previous operation began from the same key and common
    -- arguments, and ended well: only what is each operation's own is reset.
    CANDS, PENDING, LATE, NLREC = nil, nil, nil, 0
    return
  end
  CFG = keys[1]
  local k = PFX[CFG]
  if not k then
    if type(CFG) ~= 'string' or string.sub(CFG, -4) ~= ':cfg' then bad('KEYS[1] must be a config key') end
    local p = string.sub(CFG, 1, -4)
    k = {p = p, sexp = p .. 'sexp', ce = false, lx = false, lk = false, nlk = 0, lt = false}
    if IN_LIBRARY then
      if NPFX >= PASSED_MAX then PFX, NPFX = {}, 0 end
      PFX[CFG], NPFX = k, NPFX + 1
    end
  end
  P, K = k.p, k
  PUB = argv[1]
  if PUB ~= 'PUBLISH' and PUB ~= 'SPUBLISH' then
    bad('publish command must be PUBLISH or SPUBLISH')
  end
  IDLE = int(argv[2], 'idle ttl', 1000, 86400000 * 30, true)
  CANDS, PENDING, LATE, BATCH.on = nil, nil, nil, batched == true
  NLREC = 0
  -- rawget: miniredis has no struct, and refuses a read of a missing global.
  -- In a library, once found it stays.
  if not STRUCT then STRUCT = rawget(_G, 'struct') end
  -- A given clock stands in for TIME; see ARGV[3] above.
  local t = argv[3]
  if t == nil then bad('clock argument is missing') end
  if keep then return end
  -- (Domain writes wait only in a batch, and one that failed whole left
  -- none for a later call: run_batch drops them, BATCH.drop.)
  if batched then
    BATCH.flush()
    BATCH.sx = {}
  end
  LIM, DC, HEADS, QBUF, NEREC = nil, {}, {}, {}, 0
  NOW, RAW, REAL, BACK, GIVEN, EXPMS = nil, nil, nil, 0, t ~= '', nil
  if GIVEN then RAW = int(t, 'clock', 0, 9007199254740991) end
end

-- Integers and floats are formatted explicitly: redis.call would turn a Lua
-- number into a string with 14 significant digits, which loses microseconds.
-- Constant arguments are written as strings for the same reason it is slow:
-- redis.call formats a number with printf's %.14g, on every call.
local function I(x) return string.format('%d', x) end
local function F(x) return string.format('%.17g', x) end

-- Redis TIME, read once per script (on 7.0 it advances during a script),
-- so every step of one script sees the same instant; or the clock given in
-- ARGV[3], which begin has already set. The call's now is the group clock
-- built on it (clock, below).
local function raw_clock()
  if not RAW then
    local t = redis.call('TIME')
    RAW = t[1] * 1000000 + t[2] -- arithmetic reads the digits as tonumber would, without a C call
  end
  return RAW
end
local clock -- defined with the group clock, after what it needs

-- Key TTLs. Redis 7.0 judges expiry inside a script by the time the script
-- started, while TIME and a relative PEXPIRE read the clock as it is. So a
-- script that runs while the clock steps back by more than a TTL renews a
-- key to expire before the instant it judges by, and its next access to
-- the key deletes it (scenario 22 lost the config, lease records and
-- sessions that way). expire sets the deadline from this call's TIME
-- instead, read once at its start: never before the instant the script
-- judges by. A call that found TIME gone back may have started before the
-- step, so it adds the step (BACK). A clock given in ARGV[3] stands in for
-- TIME in the scripts' arithmetic only: deadlines are set on Redis's own.
local function real_clock()
  if not REAL then
    if GIVEN then
      local t = redis.call('TIME')
      REAL = t[1] * 1000000 + t[2]
    else
      REAL = raw_clock()
    end
  end
  return REAL
end

-- The deadline (Unix ms) of a key renewed now for ms. Every script reads
-- the clock (and so finds a step back) before it renews a key.
local function expiry(ms)
  local t = (real_clock() + BACK) / 1000
  return t - t % 1 + ms -- floor, without the C call (see split_encs)
end

-- The same as the PXAT argument, formatted once for all the keys a call
-- renews for the same time (most are renewed for the idle TTL).
local EXPAT = {}
-- EXPMS and EXPS (per call) are the last ms asked for and its argument:
-- a call renews most keys for the idle TTL, at one instant.
local function expiry_arg(ms)
  if ms == EXPMS then return EXPS end
  local at = expiry(ms)
  if EXPAT.at ~= at then EXPAT.at, EXPAT.s = at, I(at) end
  EXPMS, EXPS = ms, EXPAT.s
  return EXPS
end

local function expire(key, ms)
  redis.call('PEXPIREAT', key, expiry_arg(ms))
end

-- Mirrors of budget/throttle.go. Change both together.
local BETA = 0.7
local FLOOR = 0.02
local RECOVERY = 4.0          -- seconds
local WINDOW = 1000000        -- coalescing window, us
local TAU = 2.0               -- start-rate time constant, seconds
local START_MEMORY = 10000000 -- 5 x TAU, us
local MIN_BASE = 1.0
local CUBIC_C = (1 - BETA) / (RECOVERY * RECOVERY * RECOVERY)

-- In a function library (Library sets IN_LIBRARY once, at load) the
-- ceilings, parsed, outlive a call: LCACHE maps a config key to them and to
-- the limits JSON they came from. The JSON is written with them, in the same
-- HSET, so an equal JSON means equal ceilings, and a call reads 2 fields
-- instead of NCLASS + 6 (12 with today's six classes). A script sent by
-- EVALSHA starts from nothing every call and reads them all at once.
local LCACHE, LCACHED = {}, 0
local LCACHE_MAX = 1024

-- The config fields of the ceilings, in the order parse_limits reads them;
-- LIMITF_ALL adds the per-call fields the EVALSHA path reads with them.
-- (Plain loops: a library's load runs without unpack or ipairs.)
local function concat(a, b)
  local out = {}
  for i = 1, #a do out[#out + 1] = a[i] end
  for i = 1, #b do out[#out + 1] = b[i] end
  return out
end
local LIMITF = concat({'rps', 'burst', 'bodies'}, CAPF)
local CALLF = {'qu', 'rx', 'rc', 'lt', 'co', 'tl', 'ce'}
local CALLF_RID = concat(CALLF, {'rid'})
local LIMITF_LY = concat(LIMITF, {'ly'})
local LIMITF_ALL = concat(concat(LIMITF, CALLF_RID), {'ly'})

-- The layout of a budget's keys (their names, types and value formats)
-- that this build reads and writes. A config may name the layout its
-- budget is kept in (field ly; absent: 1, the layout of every build until
-- a later one writes another), and a build never acts on a budget kept in
-- a layout newer than its own: it would misread what it found, and its
-- writes would corrupt it. Every script reads the limits (limits, below)
-- before it writes anything, and fails there, with RBLAYOUT and both
-- numbers, before it has changed anything. A later build that changes the
-- layout can then rely on every build from this one on to step aside,
-- rather than on each older format being read the same by both. A library
-- reads ly with the ceilings, which it re-reads only when the limits' JSON
-- changes (LCACHE), so that costs no call anything: a build that moves a
-- budget to a newer layout must write ly in the same HSET as the limits'
-- JSON with its bytes changed (the same limits, say, with a field added),
-- or a library of this build that has the old JSON cached goes on.
--
-- Layout 2 keeps a session's leases in a hash of their own (lxkey) where
-- layout 1 kept every lease in one hash, lx, and each session's lease ids
-- in a set, sl:<sid>. Layout 3 (this build's) keeps a domain's queue as
-- one string of entries, each a waiter's whole record, where layouts 1
-- and 2 kept a sorted set of ids by ticket and a key per waiter (Queues).
-- A build converts a budget it finds in an older layout (convert_layout)
-- before its first call does anything else, and hosts of the older build
-- then step aside.
local LAYOUT = 3
local convert_layout -- defined with the queues it builds
-- check_layout returns true for a budget kept in an older layout, which
-- the caller converts, and fails for one newer than this build's.
local function check_layout(ly)
  if not ly then return true end
  if ly == '3' then return false end
  local n = tonumber(ly)
  if n and n == n and n <= LAYOUT then return n < LAYOUT end
  -- A string, not an error table: miniredis's Lua shows a table as its
  -- address. redisstore finds the code in either form of the reply.
  error('RBLAYOUT budget layout ' .. string.sub(ly, 1, 20) .. ' is newer than this build reads (' .. LAYOUT .. ')', 0)
end

-- The per-call fields (CALLF, then rid) are also kept packed, as the
-- config's field pc: CALLF's integers as big-endian 64-bit words, then the
-- run_id that wrote the budget. A call reads pc and the JSON (2 fields)
-- where it read 9, and unpacks 7 numbers where tonumber parsed 7 decimals
-- (strtod on 16 digits costs more than an HGET here). Every write of a
-- per-call field goes through cfg_put, which writes pc with it, wherever
-- the struct library is (every Redis), so pc is never older than the
-- fields. A config without pc (left by an older build, or a hand edit
-- that dropped it) is read field by field, and its next write adds pc.
local PCFMT = '>i8i8i8i8i8i8i8'
local PCLEN = 8 * #CALLF

local function parse_limits(v)
  local caps = {}
  for c = 1, NCLASS do caps[c] = tonumber(v[3 + c]) or 0 end
  return {rps = tonumber(v[1]), burst = tonumber(v[2]), bodies = tonumber(v[3]), caps = caps}
end

-- A call's view of the limits: the ceilings (shared, read-only) behind the
-- fields of this call, which it updates as it goes. v[k + 1..] are CALLF's
-- fields, then rid.
local function per_call(lim, v, k)
  for i = 1, #CALLF do lim[CALLF[i]] = tonumber(v[k + i]) or 0 end
  lim.rid = v[k + #CALLF + 1]
  return lim
end

local function limits()
  if IN_LIBRARY then
    local v = redis.call('HMGET', CFG, 'json', 'pc')
    if not v[1] then
      check_layout(redis.call('HGET', CFG, 'ly')) -- before any register
      return nil
    end
    local c = LCACHE[CFG]
    if not c or c.json ~= v[1] then
      local f = redis.call('HMGET', CFG, unpack(LIMITF_LY))
      if check_layout(f[#LIMITF_LY]) then
        convert_layout(v[1], f[#LIMITF_LY])
        return limits()
      end
      if not f[1] then
        return nil
      end
      if not c then
        if LCACHED >= LCACHE_MAX then LCACHE, LCACHED = {}, 0 end
        LCACHED = LCACHED + 1
      end
      c = parse_limits(f)
      c.json = v[1]
      c.mt = {__index = c}
      LCACHE[CFG] = c
    end
    local pc = v[2]
    if STRUCT and pc and #pc >= PCLEN then
      -- pc changes only when a per-call field is written (a clock anchor
      -- a second, a reclaim deadline, a TTL renewal), so most calls find
      -- the one the last call of this config read, already unpacked.
      if c.pc ~= pc then
        c.pqu, c.prx, c.prc, c.plt, c.pco, c.ptl, c.pce = struct.unpack(PCFMT, pc)
        c.prid = #pc > PCLEN and string.sub(pc, PCLEN + 1) or false
        c.pc = pc
      end
      -- The ceilings copied in, not behind a metatable: setmetatable is a C
      -- call (see split_encs). The call's view is the table the config's
      -- last call used, refilled (see DPOOL; a call reads the limits once,
      -- and a batch's next operation shares them): its fields are the
      -- call's to change (cfg_put), so each is assigned afresh.
      local lim = c.view
      if not lim then
        lim = {}
        c.view = lim
      end
      lim.rid, lim.qu, lim.rx, lim.rc = c.prid, c.pqu, c.prx, c.prc
      lim.lt, lim.co, lim.tl, lim.ce = c.plt, c.pco, c.ptl, c.pce
      lim.rps, lim.burst, lim.bodies, lim.caps = c.rps, c.burst, c.bodies, c.caps
      return lim
    end
    return per_call(setmetatable({}, c.mt), redis.call('HMGET', CFG, unpack(CALLF_RID)), 0)
  end
  local v = redis.call('HMGET', CFG, unpack(LIMITF_ALL))
  if check_layout(v[#LIMITF_ALL]) and v[1] then
    convert_layout(redis.call('HGET', CFG, 'json'), v[#LIMITF_ALL])
    return limits()
  end
  if not v[1] then
    return nil
  end
  return per_call(parse_limits(v), v, #LIMITF)
end

-- lims returns the budget's limits, read once per script; this script's
-- changes to qu, rx and rc update it in place. nil when the budget is not
-- stored.
local function lims()
  if LIM == nil then LIM = limits() or false end
  return LIM or nil
end

-- cfg_put writes fields of the config given as name, value pairs (numbers;
-- rid takes its string), in the call's view of the limits too, and pc with
-- them: every write of a per-call field goes through it (see PCFMT).
local function cfg_put(...)
  local a = {...}
  local lim = lims()
  local args = {}
  for i = 1, #a, 2 do
    local f, x = a[i], a[i + 1]
    if lim then lim[f] = x end
    args[#args + 1] = f
    args[#args + 1] = f == 'rid' and x or I(x)
  end
  if not lim then
    -- No budget here (no JSON): a pc left behind must not outlive it.
    redis.call('HDEL', CFG, 'pc')
  elseif STRUCT then
    args[#args + 1] = 'pc'
    args[#args + 1] = struct.pack(PCFMT, lim.qu, lim.rx, lim.rc, lim.lt, lim.co, lim.tl, lim.ce) .. (lim.rid or '')
  end
  redis.call('HSET', CFG, unpack(args))
end

-- forget_limits drops what this call read under the limits (the limits
-- and the domains loaded under them), after it has stored new ones.
local function forget_limits()
  BATCH.flush()
  LIM, DC = nil, {}
end

-- A domain is one string value holding all its fields, packed with
-- struct.pack as big-endian 64-bit words: the layout version, DFIX's
-- fields (the first DINTS as integers, the rest as doubles), then the
-- in-flight count of each class by index, as integers. One GET and one SET
-- instead of HMGETs of a dozen fields and an HSET of the changed ones: a
-- field of an HMGET costs about a quarter of a microsecond inside a script
-- here, and turning the replies into numbers as much again, while
-- unpacking the whole value costs about that of two fields. Integers in
-- big-endian words are what BITFIELD counts in, so a retirement changes
-- its counts in place, and a join behind others takes its place in line,
-- with one command and no unpacking (retire, acquire).
--   nw  waiters queued here, alive (their entries in q:<enc> not marked)
--   b   open bodies
--   ns  of nw, those of requests on several domains whose first this is
--       not (so a waiter counts once in Usage: the sum of nw - ns)
--   qh  the offset of the queue's first entry not yet passed, in bytes
--   ql  the queue string's length, in bytes
--   qb  how many bytes compaction has cut from the queue's front so far:
--       an entry's place in a waiter's marker is qb plus its offset then
--   bk  1 once the bucket is in use
--   tk  tokens                      ta  when they were counted (us)
--   th  1 while throttled           pu  pause end (us)
--   rx  when the key's TTL runs out (us), as last set by a script
--   wm, da   the throttle's factor before its last decrease, and when
--   bs, ss, sa, fs   the start rate: base, decayed sum, last start, first
--   ep  the epoch its counts are of (cfg ce; Clock jumps)
local DVERSION = 3
local DFIX = {'nw', 'b', 'ns', 'qh', 'ql', 'qb', 'bk', 'tk', 'ta', 'th', 'pu', 'rx', 'wm', 'da', 'bs', 'ss', 'sa', 'fs', 'ep'}
local DINTS = 6
-- Formats: the words before the counts, and the counts, which start at
-- byte DCOUNTS; DLEN bytes in all. BFQ, BFB and BFC[c] are the BITFIELD
-- offsets of nw, b and class c's count; BFQL and BFQB of ql and qb.
-- (String concatenation only: a library's load runs without string.rep.)
local DHFMT, DCFMT = '>i8', '>'
for i = 1, #DFIX do DHFMT = DHFMT .. (i <= DINTS and 'i8' or 'd') end
for _ = 1, NCLASS do DCFMT = DCFMT .. 'i8' end
local DFMT = DHFMT
for _ = 1, NCLASS do DFMT = DFMT .. 'i8' end
local DCOUNTS = 1 + 8 * (1 + #DFIX)
local DLEN = DCOUNTS - 1 + 8 * NCLASS
local BFQ, BFB, BFQL, BFQB, BFC = '#1', '#2', '#5', '#6', {}
for c = 1, NCLASS do BFC[c] = '#' .. (c + #DFIX) end

local function dzero(d)
  local f = {}
  for c = 1, NCLASS do f[c] = 0 end
  d.f = f
  d.nw, d.b, d.ns, d.qh, d.ql, d.qb = 0, 0, 0, 0, 0, 0
  d.bk, d.tk, d.ta, d.th, d.pu, d.rx = 0, 0, 0, 0, 0, 0
  d.wm, d.da, d.bs, d.ss, d.sa, d.fs, d.ep = 0, 0, 0, 0, 0, 0, 0
end

local function spack(d)
  return struct.pack(DFMT, DVERSION, d.nw, d.b, d.ns, d.qh, d.ql, d.qb, d.bk, d.tk, d.ta, d.th, d.pu, d.rx,
    d.wm, d.da, d.bs, d.ss, d.sa, d.fs, d.ep, unpack(d.f))
end

-- Domain tables kept for reuse, by key, in a library. A table of 27 named
-- fields costs about 8k instructions to build here (its hash part, then
-- the collector), against about 1k to assign the same fields of one that
-- exists, so a load fills the table an earlier call of this server used
-- for the same key. A call loads a key once (DC), and nothing keeps a
-- domain table past its call but a batch's next operation, which shares
-- DC (begin), so a refill never changes a table a caller still reads for
-- another value. Every field is assigned on each refill (false, not nil,
-- for the flags: a field set to nil may lose its slot, and assigning it
-- again would grow the table). Bounded by LCACHE's bound.
local DPOOL, NDPOOL = {}, 0

-- Returns a domain table for value s (nil for a value this build cannot
-- read): the pooled one refilled, or a new one with all its fields given
-- in one constructor (a table grown field by field rehashes on the way).
local function sunpack(enc, key, q, s)
  if #s ~= DLEN then return nil end
  local v, nw, b, ns, qh, ql, qb, bk, tk, ta, th, pu, rx, wm, da, bs, ss, sa, fs, ep = struct.unpack(DHFMT, s)
  if v ~= DVERSION then return nil end
  local f = {struct.unpack(DCFMT, s, DCOUNTS)}
  f[NCLASS + 1] = nil -- the position after the counts
  local d = DPOOL[key]
  if d then
    d.enc, d.key, d.q, d.s, d.new, d.f, d.b, d.bk, d.tk, d.ta = enc, key, q, s, false, f, b, bk, tk, ta
    d.th, d.pu, d.rx, d.wm, d.da, d.bs, d.ss, d.sa, d.fs, d.nw = th, pu, rx, wm, da, bs, ss, sa, fs, nw
    d.ns, d.qh, d.ql, d.qb = ns, qh, ql, qb
    d.ep, d.dirty, d.rf, d.wp, d.wat = ep, false, false, false, false
    return d
  end
  d = {enc = enc, key = key, q = q, s = s, new = false, f = f, b = b, bk = bk, tk = tk, ta = ta,
    th = th, pu = pu, rx = rx, wm = wm, da = da, bs = bs, ss = ss, sa = sa, fs = fs, nw = nw, ep = ep,
    ns = ns, qh = qh, ql = ql, qb = qb, dirty = false, rf = false, wp = false, wat = false}
  if IN_LIBRARY then
    if NDPOOL >= LCACHE_MAX then DPOOL, NDPOOL = {}, 0 end
    DPOOL[key], NDPOOL = d, NDPOOL + 1
  end
  return d
end

-- The same fields as decimal text, for servers without the struct library
-- (miniredis); nothing else reads one server's values on another.
local function tpack(d)
  local out = {'t', DVERSION}
  for i = 1, #DFIX do out[#out + 1] = F(d[DFIX[i]]) end
  for c = 1, NCLASS do out[#out + 1] = F(d.f[c]) end
  return table.concat(out, ' ')
end

local function tunpack(enc, key, q, s)
  local v = {}
  for x in string.gmatch(s, '%S+') do v[#v + 1] = x end
  if v[1] ~= 't' or tonumber(v[2]) ~= DVERSION or #v ~= 2 + #DFIX + NCLASS then return nil end
  local d = {enc = enc, key = key, q = q, s = s, new = false}
  for i = 1, #DFIX do d[DFIX[i]] = tonumber(v[2 + i]) end
  local f = {}
  for c = 1, NCLASS do f[c] = tonumber(v[2 + #DFIX + c]) end
  d.f = f
  return d
end

local function DPACK(d)
  if STRUCT then return spack(d) end
  return tpack(d)
end


local DFIXSET = {}
for i = 1, #DFIX do DFIXSET[DFIX[i]] = true end

-- The previous layout: a hash of the same fields (the counts as f<class
-- index>, zero fields absent), as a build before this one wrote them.
-- It is converted where found, keeping its TTL; the build that wrote it
-- fails on the converted value (WRONGTYPE), so it cannot count beside
-- this one.
local function dconvert(d)
  dzero(d)
  local h = redis.call('HGETALL', d.key)
  for i = 1, #h, 2 do
    local n = tonumber(h[i + 1]) or 0
    local c = string.match(h[i], '^f(%d+)$')
    if c then
      if tonumber(c) < NCLASS then d.f[tonumber(c) + 1] = n end
    elseif DFIXSET[h[i]] then
      d[h[i]] = n
    end
  end
  -- Its queue was a sorted set of an older layout still, unreadable here:
  -- its waiters join again on their next calls.
  redis.call('DEL', d.q)
  local ttl = redis.call('PTTL', d.key)
  if ttl <= 0 then ttl = IDLE end
  d.s = DPACK(d)
  redis.call('SET', d.key, d.s, 'PX', I(ttl))
end

-- Domain keys whose queue flag this server last saw set, kept past the
-- call in a library: a retirement uses it to choose how to return its
-- slots (dreturn_fast). Only a guess, which costs a command when wrong and
-- never changes a decision. Bounded like LCACHE. qh_note records a flag
-- that differs from the note; whether it does (and whether this is a
-- library) the callers check inline, which costs no call on every save.
local QH, NQH = {}, 0
local QH_MAX = 8192
local function qh_note(key, queued)
  if not queued then
    QH[key] = nil
    return
  end
  if NQH >= QH_MAX then QH, NQH = {}, 0 end
  QH[key], NQH = true, NQH + 1
end

-- Loads a domain as numbers (absent: all 0, d.new set). d.s keeps what is
-- stored, so dsave writes only when something changed. A call loads each
-- domain once: a handoff tries several waiters, often on the same domains.
local function dload(enc)
  local cached = DC[enc]
  if cached then return cached end
  local key, q = P .. 'd:' .. enc, P .. 'q:' .. enc
  -- pcall: a hash here is the previous layout's, GET's WRONGTYPE says so.
  local s = redis.pcall('GET', key)
  local d
  -- An error reply is a table with err; a string's err is nil (its
  -- metatable's string library has none), and a missing key is false.
  -- Cheaper than type(), a C call.
  if s and s.err then
    if not string.find(s.err or '', '^WRONGTYPE') then error(s) end
    d = {enc = enc, key = key, q = q}
    dconvert(d)
  else
    if s then -- (sunpack, or tunpack without struct)
      if STRUCT then d = sunpack(enc, key, q, s) else d = tunpack(enc, key, q, s) end
    end
    if not d then
      -- Missing, or a value no build writes (one of a later version):
      -- start afresh, as when a domain expires.
      d = {enc = enc, key = key, q = q, s = false, new = true}
      dzero(d)
      -- A queue left without its domain (a state loss took one and not
      -- the other) has lost where its line starts: it goes, and its
      -- waiters' calls find their places gone (see queued_at).
      redis.call('DEL', q)
    end
  end
  local lim = lims()
  local stale = lim and d.ep ~= lim.ce
  if stale then
    -- Counts of an epoch before the last rebuild (Clock jumps): its
    -- leases are gone, and re-assertion counts the live ones again.
    for c = 1, NCLASS do d.f[c] = 0 end
    d.b, d.ep, d.dirty = 0, lim.ce, true
    -- Its queue went with the epoch too (new_epoch), if it was there.
    if d.nw > 0 or d.ql > 0 then
      redis.call('DEL', q)
      d.nw, d.ns, d.qh, d.ql = 0, 0, 0, 0
    end
  end
  -- On the group clock no stored time lies ahead of now but a bucket held
  -- back by a pause. A domain that outlived its config may keep the times
  -- of the lost config's clock (Clock jumps): they are brought back to
  -- now, or its bucket would not refill until this clock caught up.
  local now = NOW
  if stale and now then
    if d.ta > now and d.ta > d.pu then d.ta = now end
    if d.da > now then d.da = now end
    if d.sa > now then d.sa = now end
    if d.fs > now then d.fs = now end
  end
  DC[enc] = d
  return d
end

local function cbrt(x)
  if x <= 0 then return 0 end
  return x ^ (1 / 3)
end

-- The domain's rate factor at now: a cubic climb from BETA*wm back to wm,
-- reached RECOVERY seconds after a decrease from 1, and past it to 1.
local function factor(d, now)
  if d.th ~= 1 then return 1 end
  local t = (now - d.da) / 1000000
  local x = t - cbrt(d.wm * (1 - BETA) / CUBIC_C)
  local f = CUBIC_C * x * x * x + d.wm
  if f > 1 then f = 1 end
  if f < FLOOR then f = FLOOR end
  return f
end

-- Ends a throttle whose factor is back at 1.
local function settle(d, now, lim)
  if d.th == 1 and factor(d, now) >= 1 then
    d.th = 0
    d.bs = 0
    if lim.rps == 0 then d.bk = 0 end
  end
end

-- Effective rate (per second) and bucket size; rate 0 means unlimited.
local function rate(d, now, lim)
  local f = factor(d, now)
  if lim.rps > 0 then
    return lim.rps * f, math.max(1, lim.burst * f)
  elseif d.th == 1 then
    local r = d.bs * f
    return r, math.max(1, r)
  end
  return 0, 0
end

-- rf notes a bucket changed since the domain was saved (try_grant).
local function refill(d, now, r, burst)
  if d.bk ~= 1 then
    d.bk, d.tk, d.ta, d.rf = 1, burst, now, true
    return
  end
  local dt = (now - d.ta) / 1000000
  if dt > 0 then
    d.tk = d.tk + dt * r
    d.ta, d.rf = now, true
  end
  if d.tk > burst then d.tk, d.rf = burst, true end
end

-- Mirrors decayRate in budget/throttle.go, shortcut included: for
-- back-to-back starts three terms of the series stand in for the
-- exponential, and both stores must compute the same sum.
local function decay(sum, dt)
  if dt <= 0 then return sum end
  local x = dt / TAU
  if x < 1e-3 then return sum * (1 - x + x * x / 2) end
  return sum * math.exp(-x)
end

-- Bias-corrected start rate; see measuredRate in budget/throttle.go.
local function measured(d, now)
  local age = math.max((now - d.fs) / 1000000, 1)
  return decay(d.ss, (now - d.sa) / 1000000) / (1 - math.exp(-age / TAU))
end

-- Writes the domain back when it changed since dload. Its TTL must let its
-- bucket refill and its pause and start history run out, so that an
-- expired domain is exactly a fresh one (a hard need), and should reach an
-- idle period past its last use: it is renewed (SET PX) when the hard need
-- is not met or when less than half an idle period is left, else the value
-- keeps its TTL (SET KEEPTTL). lim is nil when the config is gone (a
-- retirement can still run): then only the pause counts as a hard need.
-- clean says the caller changed nothing since dload and no one else did
-- (d.dirty): then only a TTL renewal that is due writes, and the value is
-- not packed just to be compared (a pack costs as much as a command).
local function dsave(d, now, lim, clean)
  local hard = 0
  if lim and d.bk == 1 then
    local r, burst = rate(d, now, lim)
    if r > 0 and d.tk < burst then
      hard = math.ceil((burst - d.tk) / r * 1000) + 1000
    end
  end
  if d.pu > now then
    hard = math.max(hard, math.ceil((d.pu - now) / 1000) + IDLE)
  end
  local raw = raw_clock() -- the clock key TTLs run on
  local renew = d.rx < raw + hard * 1000 or d.rx < raw + IDLE * 500
  local ttl = hard > IDLE and hard or IDLE
  if clean and not renew and not d.new and not d.dirty then return end
  if renew then d.rx = raw + ttl * 1000 end
  if BATCH.on and STRUCT then
    -- In a batch the value is packed once, at its end, from a copy of
    -- the fields as this save leaves them (a later operation that fails
    -- must not have its changes written): a copy costs a fraction of a
    -- pack, and a domain is saved by most operations of a batch.
    local c = d.sn
    if not c then
      c = {f = {}}
      d.sn = c
    end
    c.nw, c.b, c.ns, c.qh, c.ql, c.qb, c.bk, c.tk, c.ta, c.th = d.nw, d.b, d.ns, d.qh, d.ql, d.qb, d.bk, d.tk, d.ta, d.th
    c.pu, c.rx, c.wm, c.da, c.bs, c.ss, c.sa, c.fs, c.ep = d.pu, d.rx, d.wm, d.da, d.bs, d.ss, d.sa, d.fs, d.ep
    local f, cf = d.f, c.f
    for k = 1, NCLASS do cf[k] = f[k] end
    if renew then
      local at = expiry_arg(ttl)
      d.wat = at
      if d.ql > 0 then redis.call('PEXPIREAT', d.q, at) end
      redis.call('ZADD', P .. 'doms', I(raw), d.enc)
      expire(P .. 'doms', IDLE)
    end
    if not d.wp then d.wp, BATCH.pend[#BATCH.pend + 1] = true, d end
    d.new, d.dirty, d.rf = false, false, false
    if IN_LIBRARY and (d.nw > 0) ~= (QH[d.key] == true) then qh_note(d.key, d.nw > 0) end
    return
  end
  local s = STRUCT and spack(d) or tpack(d) -- DPACK, inlined
  if renew then
    local at = expiry_arg(ttl)
    if BATCH.on then
      d.wat = at
      if not d.wp then d.wp, BATCH.pend[#BATCH.pend + 1] = true, d end
    else
      redis.call('SET', d.key, s, 'PXAT', at)
    end
    -- A queue's TTL follows its domain's (see qexpire).
    if d.ql > 0 then redis.call('PEXPIREAT', d.q, at) end
    redis.call('ZADD', P .. 'doms', I(raw), d.enc)
    expire(P .. 'doms', IDLE)
  elseif s ~= d.s then
    if not BATCH.on then
      redis.call('SET', d.key, s, 'KEEPTTL')
    elseif not d.wp then
      d.wp, BATCH.pend[#BATCH.pend + 1] = true, d
    end
  end
  d.s, d.new, d.dirty, d.rf = s, false, false, false
  if IN_LIBRARY and (d.nw > 0) ~= (QH[d.key] == true) then qh_note(d.key, d.nw > 0) end
end

-- Writes the domains whose saves a batch deferred, each once, as its last
-- save left it (d.sn, the copy dsave took: what the operations that ended
-- well made of it, not what a failed one changed after), with the TTL of
-- its latest renewal if one was due, and only if that changed it. The pack
-- happens here, once per domain and batch, not at every save. Every
-- operation of a batch reads a domain it has loaded through DC, never from
-- Redis (dreturn_fast and acquire's join go around DC only for a domain it
-- has not), so a write need not land before the batch's end, and a domain
-- several operations save is written once: a SET costs what a small
-- script's whole work does.
function BATCH.flush()
  local pend = BATCH.pend
  local n = #pend
  if n == 0 then return end
  for k = 1, n do
    local d = pend[k]
    local s = STRUCT and spack(d.sn) or d.s -- (a batch runs in a library, which has struct)
    if d.wat then
      redis.call('SET', d.key, s, 'PXAT', d.wat)
    elseif s ~= d.s then
      redis.call('SET', d.key, s, 'KEEPTTL')
    end
    d.s, d.wp, d.wat, pend[k] = s, false, false, nil
  end
end

-- Forgets the writes a batch that failed whole (its flush raised) left
-- waiting: they are not the next batch's to make.
function BATCH.drop()
  local pend = BATCH.pend
  for k = #pend, 1, -1 do pend[k].wp, pend[k].wat, pend[k] = false, false, nil end
end

-- A queue's TTL follows its domain's: dsave renews the two together (the
-- queue while its string has any length), so a queue that holds waiters
-- lives at least until its domain's rx, and a waiter that joins a queue
-- it found with a head renews nothing. A ZADD to a missing queue makes it
-- with no TTL, so a join that cannot vouch the queue existed calls this:
-- it gives the queue what its domain has left, unless that is due for
-- renewal, which this call's save of the domain (every join saves its
-- domains) does for both. Heartbeats that renew a domain's key renew its
-- queue too.
local function qexpire(d)
  local left = d.rx - raw_clock() -- us, on the clock rx is kept on
  if left < IDLE * 500 then return end
  local ms = left / 1000
  -- Formatted here, not by expiry_arg, whose one-entry cache holds the
  -- idle TTL's argument that the rest of the join renews with.
  redis.call('PEXPIREAT', d.q, I(expiry(ms - ms % 1 + 1000)))
end

-- The key of session sid's leases. Its name holds the config's ce, the
-- epoch the domains' counts are of (Clock jumps), so a new epoch that
-- wipes the counts (a rebuild, or a config made anew after a loss) puts
-- every record of the old one out of reach at once, wherever it survived:
-- a retirement or a look for a lease finds nothing there, re-assertion
-- counts each lease once, and the keys left behind expire with their TTL.
-- The prefix for the config's ce is kept with its keys (K), formatted once
-- in a library.
local function lxkey(sid)
  local lim, k = lims(), K
  local ce = lim and lim.ce or 0
  if k.ce ~= ce then
    k.ce, k.lx, k.lk, k.nlk, k.lt = ce, k.p .. 'lx:' .. I(ce) .. ':', {}, 0, {}
  end
  -- The keys made, by session: a concatenation builds and hashes a new
  -- string on every call, a lookup does not. Bounded like PASSED.
  local lk = k.lk[sid]
  if lk then return lk end
  lk = k.lx .. sid
  if IN_LIBRARY then
    if k.nlk >= PASSED_MAX then k.lk, k.nlk, k.lt = {}, 0, {} end
    k.lk[sid], k.nlk = lk, k.nlk + 1
  end
  return lk
end

-- Renews the config hash's TTL when half of it is spent, and with it those
-- of the sessions, their leases and waiters' markers, and the domain list
-- (a waiter that joins behind another renews none: see acquire; a
-- session's heartbeats renew its leases too). Once per half an idle TTL,
-- a command per session. While the
-- config lives, they do, so a config that outlived a clock jump vouches
-- for them (Clock jumps). Key TTLs run on Redis TIME, not the group clock. A call that
-- found TIME gone back leaves it to the next call, which surely started
-- after the step (expire): it would set the config no shorter a TTL.
local function touch_cfg()
  local lim = lims()
  if not lim then return end
  if BACK > 0 then
    if lim.rx ~= 0 then cfg_put('rx', 0) end
    return
  end
  local raw = raw_clock()
  if lim.rx < raw + IDLE * 500 then
    cfg_put('rx', raw + IDLE * 1000)
    expire(CFG, IDLE)
    for _, k in ipairs({'sexp', 'doms'}) do expire(P .. k, IDLE) end
    for _, sid in ipairs(redis.call('ZRANGE', K.sexp, 0, -1)) do expire(lxkey(sid), IDLE) end
  end
end

-- Keeps the config's rc no later than a deadline at (us) just written, so
-- reclaim runs when it may pass.
local function lower_rc(at)
  local lim = lims()
  if lim and at < lim.rc then cfg_put('rc', at) end
end

-- A lease is one field of its session's hash (lxkey): its id -> its
-- record, of hr and hb (1 while its request slot and its body slot are
-- held), its class, the grant's time (us), its session sid, its domain
-- encodings joined by commas, and its consumer (any bytes). The leases of
-- a session share one key, so one PEXPIRE by its heartbeat keeps them all,
-- a grant writes one field (no set of the session's leases to keep beside
-- it), a retirement reads and deletes one, and reclaim reads a dead
-- session's records straight from its hash. Where
-- the struct library is, the record is binary (LFMT: a version byte, hr,
-- hb and the class as bytes, the time as a word, then the three strings
-- each after its length), as a waiter's is (wpack); else it is the text
-- "<hr><hb> <class> <granted> <sid> <encs> <consumer>", which an older
-- build also wrote, and which is read wherever it is found.
local LVERSION = 1
local LFMT = '>BBBBi8I4c0I4c0I4c0'

local function lease_pack(hr, hb, class, granted, sid, encs, consumer)
  if STRUCT then
    return struct.pack(LFMT, LVERSION, hr, hb, class, granted, #sid, sid, #encs, encs, #consumer, consumer)
  end
  -- One format for the numbers; the strings are joined, since %s stops
  -- at a zero byte and a consumer may hold any bytes.
  return string.format('%d%d %d %d ', hr, hb, class, granted) .. sid .. ' ' .. encs .. ' ' .. consumer
end

local function lease_unpack(v)
  if STRUCT then
    -- pcall: a value too short for the format is an error to struct.
    local ok, ver, hr, hb, c, g, sid, ds, cs, at_end = pcall(struct.unpack, LFMT, v)
    if ok and ver == LVERSION then
      if at_end ~= #v + 1 or (hr ~= 0 and hr ~= 1) or (hb ~= 0 and hb ~= 1) or sid == '' or ds == '' then
        return nil
      end
      NLREC = NLREC + 1
      local lrecs = REUSE.lrecs
      local l = lrecs[NLREC]
      if not l then
        l = {hr = hr, hb = hb, c = c, g = g, sid = sid, ds = ds, cs = cs}
        if NLREC <= RECS_MAX then lrecs[NLREC] = l end
        return l
      end
      l.hr, l.hb, l.c, l.g, l.sid, l.ds, l.cs = hr, hb, c, g, sid, ds, cs
      return l
    end
  end
  local hr, hb, c, g, sid, ds, cs = string.match(v, '^([01])([01]) (%d+) (%d+) (%S+) (%S+) (.*)$')
  if not hr then return nil end
  return {hr = tonumber(hr), hb = tonumber(hb), c = tonumber(c), g = tonumber(g), sid = sid, ds = ds, cs = cs}
end

-- Writes lease id's record v in session sid. The key holds an empty field
-- besides the leases (no id is empty), so it outlives the session's last
-- lease with its TTL, until the session ends (end_session deletes it) or
-- the TTL runs out; the session's heartbeats and the config's renewals
-- renew it. A write that cannot vouch for the key writes the empty field
-- too and renews its TTL: a library vouches for a key it wrote so less
-- than half an idle TTL ago by Redis's own clock (K.lt), as nothing but
-- end_session deletes one, and a new epoch's keys have other names. So a
-- grant into a session a library knows is one HSET of one field. full
-- asks for the whole write whatever the library knows (a re-assertion,
-- which may revive an ended session's key). nx writes the field only if
-- the hash has none of that name (a waiter's marker: see Queues), and
-- returns whether it did. A call
-- that found TIME gone back always renews, with the step (expire): keys
-- renewed before the step, the config among them, expire that much later
-- by Redis's clock, and the config must not outlive the records it
-- vouches for.
local function lease_put(sid, id, v, full, nx)
  local lk, k = lxkey(sid), K -- (lxkey makes k.lt)
  local raw = real_clock()
  local t = k.lt[lk]
  local vouched = t and t > raw and BACK == 0 and not full
  if nx then
    if redis.call('HSETNX', lk, id, v) == 0 then return false end
    if vouched then return true end
    redis.call('HSET', lk, '', '')
  elseif vouched then
    redis.call('HSET', lk, id, v)
    return true
  else
    redis.call('HSET', lk, id, v, '', '')
  end
  expire(lk, IDLE)
  if IN_LIBRARY then k.lt[lk] = raw + IDLE * 500 end
  return true
end

-- session returns how long (us) session sid has left for a lease granted
-- now, or nil when the session is dead (its deadline passed, or reclaim
-- ended it). A session named for the first time by a call of its process
-- (a join or a grant) is created with ttl (us) to live; one with less than
-- two thirds of ttl left is extended to ttl, which only postpones the
-- deadline of a live session (never a renewal of a dead one). Heartbeats
-- and renewals renew a session every third of a TTL, so with a live
-- process this reads one score and writes nothing.
--
-- A handoff (handoff set) grants on behalf of a queued waiter whose
-- process may have died since: it neither creates nor extends the
-- session, so a crashed process's leases are not kept past what its last
-- call or renewal vouched for. The waiter's queued place lives as long as
-- its session does (see queues), so its session is there, and the waiter
-- hears how much less than a TTL is left of it (try_grant).
--
-- A batch's operations share the deadlines read and written (BATCH.sx):
-- only these scripts change a session's score within one, here and in
-- end_session, which keep it up to date.
local function session(sid, ttl, now, handoff)
  local sx, memo = K.sexp, BATCH.on and BATCH.sx
  local d = memo and memo[sid]
  if not d then
    -- Scores read by arithmetic, as tonumber would, without its C call.
    d = redis.call('ZSCORE', sx, sid)
    if d then
      d = d + 0
      if memo then memo[sid] = d end
    end
  end
  if d then
    if d <= now then return nil end
    if handoff or d - now >= ttl * 2 / 3 then return d - now end
  elseif handoff or redis.call('ZSCORE', P .. 'sgone', sid) then
    return nil
  end
  local at = now + ttl
  redis.call('ZADD', sx, I(at), sid)
  if memo then memo[sid] = at end
  if not d then
    expire(sx, IDLE)
    lower_rc(at)
  end
  return at - now
end

-- Ends session sid, whose leases are all retired: its name goes to sgone
-- (pruned of names older than an idle TTL as it goes).
local function end_session(sid, now)
  local gone = P .. 'sgone'
  redis.call('ZREM', K.sexp, sid)
  BATCH.sx[sid] = nil
  redis.call('ZADD', gone, I(now), sid)
  redis.call('ZREMRANGEBYSCORE', gone, '-inf', I(now - IDLE * 1000))
  expire(gone, IDLE)
  local lk = lxkey(sid)
  redis.call('DEL', P .. 'sd:' .. sid, lk)
  K.lt[lk] = nil -- a re-assertion may revive it (lease_put)
end

-- Queues. A domain's queue, q:<enc>, is one string: its waiters' entries
-- one after another, in the order their joins ran. A join on several
-- domains appends to each of its queues in one script, so any two waiters
-- that share queues stand in the same order in each: one total order by
-- arrival, without a ticket. An entry is the waiter's whole record (Q.fmt:
-- its length, a version byte, a mark, class and body flag, TTL and
-- arrival, then its id, session, process channel, domains and consumer,
-- each after its length; domains empty for a request on this domain
-- alone), so a handoff reads the head and the one after it with one
-- GETRANGE and needs no other key. The domain's value says where the
-- line starts (qh: entries before it are passed), how long the string is
-- (ql) and how many live entries it holds (nw); a waiter's last entry
-- gone, the queue is deleted. Passed bytes are cut off once they are at
-- least half the string (q_compact), and qb counts them, so a place given
-- as qb plus an offset stays valid.
--
-- A waiter also has a marker: the field of its id in its session's hash
-- (lxkey), "W<places> <domains>", its places (qb plus offset, one per
-- domain, comma-separated) and its domains. The marker is how a call finds
-- the waiter (a retried first call sees it and does not join twice), how a
-- cancel finds its entries (and marks them, byte EDEAD, which a head skips),
-- and how reclaim finds the waiters of a dead session. A grant overwrites
-- it with the lease. So a waiter lives as long as its session: a process
-- keeps its session alive while it has waiters (renew.lua) as while it
-- holds leases, and a waiter it no longer wants it cancels.
--
-- Where the struct library is (every Redis) entries are binary; without it
-- (miniredis) text of the same fields, each string after its length.
local Q = {ver = 1, read = 511, compact = 16384,
  fmt = '>I4BBBBi8i8I4c0I4c0I4c0I4c0I4c0',
  dead = 5} -- (9 in text: see epack)

local function epack(id, sid, ch, c, b, ttl, at, ds, cs)
  if STRUCT then
    return struct.pack(Q.fmt, 44 + #id + #sid + #ch + #ds + #cs, Q.ver, 0, c, b, ttl, at,
      #id, id, #sid, sid, #ch, ch, #ds, ds, #cs, cs)
  end
  local body = string.format('T0 %d %d %d %d ', c, b, ttl, at) .. #id .. ':' .. id .. #sid .. ':' .. sid ..
    #ch .. ':' .. ch .. #ds .. ':' .. ds .. #cs .. ':' .. cs
  return string.format('%08d', #body + 8) .. body
end

-- The entry that starts at byte pos of s, or nil and the length it needs
-- when s holds less of it (nil alone for bytes that are no entry).
local function eparse(s, pos)
  if STRUCT then
    -- The whole entry at once: a queue's read holds it nearly always.
    local ok, n, v, dead, c, b, ttl, at, id, sid, ch, ds, cs, nx = pcall(struct.unpack, Q.fmt, s, pos)
    if not ok then
      -- Cut short by the read, or no entry.
      if #s < pos + 3 then return nil, 4 end
      n = struct.unpack('>I4', s, pos)
      if n >= 44 and #s < pos + n - 1 then return nil, n end
      return nil
    end
    if v ~= Q.ver or nx ~= pos + n then return nil end
    -- A table of the ring (see REUSE), refilled.
    NEREC = NEREC + 1
    local e = REUSE.erecs[NEREC]
    if not e then
      e = {id = id, sid = sid, ch = ch, c = c, b = b, ttl = ttl, at = at, ds = ds, cs = cs, dead = dead, len = n,
        off = 0, enc = false}
      if NEREC <= RECS_MAX then REUSE.erecs[NEREC] = e end
      return e
    end
    e.id, e.sid, e.ch, e.c, e.b, e.ttl, e.at, e.ds, e.cs, e.dead, e.len = id, sid, ch, c, b, ttl, at, ds, cs, dead, n
    return e
  end
  if #s < pos + 7 then return nil, 8 end
  local n = tonumber(string.sub(s, pos, pos + 7))
  if not n then return nil end
  if #s < pos + n - 1 then return nil, n end
  local e = string.sub(s, pos, pos + n - 1)
  local dead, c, b, ttl, at, p = string.match(e, '^%d+T([01]) (%d+) (%d+) (%d+) (%d+) ()')
  if not dead then return nil end
  local f = {}
  for i = 1, 5 do
    local m, q = string.match(e, '^(%d+):()', p)
    if not m then return nil end
    f[i] = string.sub(e, q, q + m - 1)
    p = q + m
  end
  return {id = f[1], sid = f[2], ch = f[3], c = tonumber(c), b = tonumber(b), ttl = tonumber(ttl), at = tonumber(at),
    ds = f[4], cs = f[5], dead = tonumber(dead), len = n, off = 0, enc = false}
end

-- The entry at offset so of domain d's queue, or nil past its end. A call
-- reads a queue's bytes once where it can (QBUF): the head's read brings
-- the entry after it too.
local function q_at(d, so)
  if so >= d.ql then return nil end
  local buf, e, need = QBUF[d.q], nil, nil
  if buf and so >= buf.from then e = eparse(buf.s, so - buf.from + 1) end
  if not e then
    local s = redis.call('GETRANGE', d.q, so, so + Q.read - 1)
    e, need = eparse(s, 1)
    if not e and need and need > #s and so + need <= d.ql then
      s = redis.call('GETRANGE', d.q, so, so + need - 1)
      e = eparse(s, 1)
    end
    QBUF[d.q] = {from = so, s = s}
  end
  if e then e.off, e.enc = so, d.enc end
  return e
end

-- Empties domain d's queue: its last live waiter left, or its bytes no
-- longer agree with the domain's account of them.
local function q_clear(d)
  if d.ql > 0 then redis.call('DEL', d.q) end
  d.nw, d.ns, d.qh, d.ql, d.dirty = 0, 0, 0, 0, true
  HEADS[d.q], QBUF[d.q] = false, nil
end

-- The first live entry of domain d's queue, or nil; marked entries before
-- it are passed (qh moves on, saved with the domain).
local function q_head(d)
  local h = HEADS[d.q]
  if h ~= nil then return h or nil end
  if d.nw <= 0 then
    if d.ql > 0 then q_clear(d) end
    HEADS[d.q] = false
    return nil
  end
  local e = q_at(d, d.qh)
  while e and e.dead ~= 0 do
    d.qh, d.dirty = d.qh + e.len, true
    e = q_at(d, d.qh)
  end
  if not e then
    q_clear(d) -- nw counted waiters the string does not hold
    return nil
  end
  HEADS[d.q] = e
  return e
end

-- Cuts passed bytes off the queue's front once they are half of it.
local function q_compact(d)
  if d.qh < Q.compact or d.qh * 2 < d.ql then return end
  redis.call('SET', d.q, redis.call('GETRANGE', d.q, d.qh, -1), 'KEEPTTL')
  d.qb, d.ql, d.qh, d.dirty = d.qb + d.qh, d.ql - d.qh, 0, true
  HEADS[d.q], QBUF[d.q] = nil, nil
end

-- Takes e, the head of domain d's queue, out of it (secondary: a request
-- on several domains, and d not its first).
local function q_pop(d, e, secondary)
  d.nw, d.dirty = d.nw - 1, true
  if secondary then d.ns = d.ns - 1 end
  HEADS[d.q] = nil
  if d.nw <= 0 then return q_clear(d) end
  d.qh = e.off + e.len
  q_compact(d)
end

-- Appends entry s to domain d's queue; returns its place (qb + offset).
local function q_append(d, s, secondary)
  local off = d.ql
  local len = redis.call('APPEND', d.q, s)
  if len ~= off + #s then
    -- The string is not what the domain says (a state loss took one
    -- and not the other): the line starts again with this entry, and
    -- the waiters it held find their places gone (queued_at).
    if len ~= #s then
      redis.call('DEL', d.q)
      redis.call('APPEND', d.q, s)
    end
    off, d.nw, d.ns, d.qh = 0, 0, 0, 0
    HEADS[d.q], QBUF[d.q] = nil, nil
  end
  if off == 0 then qexpire(d) end -- it made the key
  if d.nw == 0 then HEADS[d.q] = nil end
  d.ql, d.nw, d.dirty = off + #s, d.nw + 1, true
  if secondary then d.ns = d.ns + 1 end
  -- What was read of the queue stays true: an append changes no byte
  -- before it, and an entry the read cut short is read again (q_at).
  return d.qb + off
end

-- A marker's places and domains, or nil for a value that is no marker.
local function mparse(v)
  if string.byte(v, 1) ~= 87 then return nil end -- 'W'
  local ps, ds = string.match(v, '^W([%d,]+) (%S+)$')
  if not ps then return nil end
  local offs = {}
  for x in string.gmatch(ps, '%d+') do offs[#offs + 1] = x + 0 end
  return offs, ds
end

-- Waiter wid's live entry in domain d's queue at place at, or nil.
local function queued_at(d, at, wid)
  local so = at - d.qb
  if so < d.qh or so >= d.ql then return nil end
  local h = q_head(d)
  if h and h.off == so then return h.id == wid and h or nil end
  local e = q_at(d, so)
  if e and e.id == wid and e.dead == 0 then return e end
  return nil
end

local function wake(e)
  redis.call(PUB, P .. 'wake:' .. e.ch, e.id)
end

-- Waiters that may be able to move after this script's changes: new heads
-- of queues, and heads of queues where something came free, as entries.
-- done() tries to grant each one here and now (a handoff), which lets one
-- release fill every free slot at once instead of one slot per
-- wake-and-call, and wakes only those that must act: a waiter granted (to
-- collect its lease), or one held back by time (the rate or a pause),
-- which must learn how long to sleep. One held back by a ceiling stays
-- asleep: the release that frees its slot will try it again. A waiter
-- already listed and not yet tried is not listed twice (a release on 4
-- domains finds one head 4 times): its one try comes after whatever
-- listed it.
local function candidate(e)
  local wid = e.id
  if not CANDS then
    CANDS, PENDING = {e}, {[wid] = true}
    return
  end
  if PENDING[wid] then return end
  PENDING[wid] = true
  CANDS[#CANDS + 1] = e
end

-- Takes the waiter whose marker (in session sid's hash) is v out of every
-- queue and drops the marker; whoever now heads those queues is a
-- candidate. An entry not found where the marker says was lost already.
local function unqueue(wid, sid, v)
  local offs, ds = mparse(v)
  if offs then
    local es = split_encs(ds)
    local now, lim = clock(), lims()
    for k = 1, #es do
      local d = dload(es[k])
      local e = offs[k] and queued_at(d, offs[k], wid)
      if e then
        local h = q_head(d)
        if h and h.off == e.off then
          q_pop(d, h, k > 1)
          local nh = q_head(d)
          if nh then candidate(nh) end
        else
          redis.call('SETRANGE', d.q, e.off + (STRUCT and Q.dead or 9), STRUCT and '\1' or '1')
          QBUF[d.q] = nil
          d.nw, d.dirty = d.nw - 1, true
          if k > 1 then d.ns = d.ns - 1 end
          if d.nw <= 0 then q_clear(d) end
        end
        dsave(d, now, lim)
      end
    end
  end
  redis.call('HDEL', lxkey(sid), wid)
end

-- Takes waiter wid of session sid out of line, if it is queued there.
-- Returns whether it was.
local function remove_waiter(wid, sid)
  local v = redis.call('HGET', lxkey(sid), wid)
  if not v or string.byte(v, 1) ~= 87 then return false end
  unqueue(wid, sid, v)
  return true
end

-- Moves a budget from an older layout (LAYOUT) to this build's, once, in
-- the first call of this build that finds it (within limits(), so it
-- reads what it needs itself), before anything else is done:
--   - from layout 1: each record of lx goes to its session's hash, as
--     lease_put writes one, and lx and the sessions' sets sl:<sid> go;
--   - from layouts 1 and 2: the queues, sorted sets of waiter ids by
--     ticket, become strings of entries made from the waiters' records
--     (w:<id>), in ticket order, each waiter with its marker; the records
--     and wexp go, and each domain's value takes the new fields. A waiter
--     keeps its place, and now lives as long as its session.
-- The config then names layout 3, in the same HSET as its JSON with the
-- layout put first, as every host of this build sends it (redisstore,
-- storedLimits), so that a library of an older build that has the old
-- JSON cached reads ly again and steps aside. The epoch, counts and
-- sessions stay as they are. Work in the number of leases and waiters,
-- once per budget.
function Q.old_waiter(v)
  if STRUCT then
    local ok, ver, t, c, b, at, ttl, ch, sn, ds, cs, at_end = pcall(struct.unpack, '>Bi8BBi8i8I4c0I4c0I4c0I4c0', v)
    if ok and ver == 1 and at_end == #v + 1 then
      return {c = c, b = b, at = at, ttl = ttl, ch = ch, sn = sn, ds = ds, cs = cs}
    end
  end
  local t, c, b, at, ttl, ch, sn, ds, cs = string.match(v, '^(%d+) (%d+) ([01]) (%d+) (%d+) (%S+) (%S+) (%S+) (.*)$')
  if not t then return nil end
  return {c = tonumber(c), b = tonumber(b), at = tonumber(at), ttl = tonumber(ttl), ch = ch, sn = sn, ds = ds, cs = cs}
end

-- A domain value of layout 2 (version 2: qf, b, then thirteen doubles,
-- then the counts) as this build's, with its queue's account; nil for one
-- that is not.
function Q.old_domain(s, nw, ns, ql)
  local v
  if STRUCT then
    if #s ~= 8 * (16 + NCLASS) then return nil end
    local fmt = '>i8i8i8'
    for _ = 1, 13 do fmt = fmt .. 'd' end
    for _ = 1, NCLASS do fmt = fmt .. 'i8' end
    v = {struct.unpack(fmt, s)}
    v[1] = v[1] == 2 and 2 or nil
  else
    v = {}
    for x in string.gmatch(s, '%S+') do v[#v + 1] = tonumber(x) or x end
    if v[1] ~= 't' or v[2] ~= 2 or #v ~= 17 + NCLASS then return nil end
    table.remove(v, 1)
  end
  if v[1] ~= 2 then return nil end
  local d = {nw = nw, ns = ns, qh = 0, ql = ql, qb = 0, b = v[3], f = {}}
  local rest = {'bk', 'tk', 'ta', 'th', 'pu', 'rx', 'wm', 'da', 'bs', 'ss', 'sa', 'fs', 'ep'}
  for i = 1, #rest do d[rest[i]] = v[3 + i] end
  for c = 1, NCLASS do d.f[c] = v[16 + c] end
  return DPACK(d)
end

function convert_layout(json, ly)
  local ce = tonumber(redis.call('HGET', CFG, 'ce')) or 0
  local pre = P .. 'lx:' .. I(ce) .. ':'
  local function put(sid, id, v)
    local lk = pre .. sid
    if redis.call('HSET', lk, id, v, '', '') == 2 then expire(lk, IDLE) end
  end
  if not ly or ly == '1' then
    local lx = P .. 'lx'
    local h = redis.call('HGETALL', lx)
    local sids = {}
    for i = 1, #h, 2 do
      local l = lease_unpack(h[i + 1])
      if l then
        put(l.sid, h[i], h[i + 1])
        sids[l.sid] = true
      end
    end
    redis.call('DEL', lx)
    for _, sid in ipairs(redis.call('ZRANGE', K.sexp, 0, -1)) do sids[sid] = true end
    for sid in pairs(sids) do redis.call('DEL', P .. 'sl:' .. sid) end
  end
  -- The waiters of every queue, once each, in ticket order.
  local doms = redis.call('ZRANGE', P .. 'doms', 0, -1)
  local ws, seen, zq = {}, {}, {}
  for _, enc in ipairs(doms) do
    local q = P .. 'q:' .. enc
    if redis.call('TYPE', q).ok == 'zset' then
      zq[enc] = true
      local z = redis.call('ZRANGE', q, 0, -1, 'WITHSCORES')
      for i = 1, #z, 2 do
        if not seen[z[i]] then
          seen[z[i]] = true
          ws[#ws + 1] = {t = tonumber(z[i + 1]), id = z[i]}
        end
      end
    end
  end
  table.sort(ws, function(a, b) return a.t < b.t end)
  local bufs, lens, nws, nss = {}, {}, {}, {}
  for _, x in ipairs(ws) do
    local key = P .. 'w:' .. x.id
    local v = redis.pcall('GET', key)
    local w = type(v) == 'string' and Q.old_waiter(v)
    -- (One converted from a still older hash without its TTL or session
    -- would be no waiter here: its own next call joins again.)
    if w and w.ttl > 0 and w.sn ~= '-' then
      local es = split_encs(w.ds)
      local entry = epack(x.id, w.sn, w.ch, w.c, w.b, w.ttl, w.at, #es > 1 and w.ds or '', w.cs)
      local offs = {}
      for k, e in ipairs(es) do
        if not bufs[e] then bufs[e], lens[e], nws[e], nss[e] = {}, 0, 0, 0 end
        offs[k] = I(lens[e])
        bufs[e][#bufs[e] + 1] = entry
        lens[e], nws[e] = lens[e] + #entry, nws[e] + 1
        if k > 1 then nss[e] = nss[e] + 1 end
      end
      put(w.sn, x.id, 'W' .. table.concat(offs, ',') .. ' ' .. w.ds)
    end
    redis.call('DEL', key)
  end
  redis.call('DEL', P .. 'wexp')
  for _, enc in ipairs(doms) do
    local dk, q = P .. 'd:' .. enc, P .. 'q:' .. enc
    local s = redis.pcall('GET', dk)
    local nv = type(s) == 'string' and Q.old_domain(s, nws[enc] or 0, nss[enc] or 0, lens[enc] or 0)
    if zq[enc] then redis.call('DEL', q) end
    if nv then
      local ttl = redis.call('PTTL', dk)
      if ttl <= 0 then ttl = IDLE end
      redis.call('SET', dk, nv, 'PX', I(ttl))
      if bufs[enc] then redis.call('SET', q, table.concat(bufs[enc]), 'PX', I(ttl)) end
    end
  end
  if not json then
    redis.call('HSET', CFG, 'ly', I(LAYOUT))
    return
  end
  local js = string.gsub(json, '^{"layout":%d+,?', '{', 1)
  if js == '{}' then
    js = '{"layout":3}'
  else
    js = '{"layout":3,' .. string.sub(js, 2)
  end
  redis.call('HSET', CFG, 'ly', I(LAYOUT), 'json', js)
end

-- Returns a lease's parts (dr, db: its request slot, its body slot) to
-- domain enc, class index ci, by loading and saving the domain. With
-- defer, a domain whose queue has a head is saved when the call ends
-- (done) instead: the handoff that follows most often grants that head,
-- and its grant saves the domain with both changes in one write.
local function dreturn(enc, ci, dr, db, now, lim, defer)
  local d = dload(enc)
  -- A domain outlives its leases (heartbeats renew it), so one that is
  -- missing went with its counts (a state loss): there is nothing to
  -- return, and nothing is written, so no key is made without cause. For
  -- the same reason a count never goes below zero.
  if not d.new then
    if dr and d.f[ci] > 0 then d.f[ci] = d.f[ci] - 1 end
    if db and d.b > 0 then d.b = d.b - 1 end
  end
  local h
  if d.nw > 0 then
    -- A queue that cannot be read (a key of the wrong type, put there by
    -- hand) fails the call, but the slots go back first: a script's
    -- writes stay when it fails, and the release must be among them.
    local ok, e = pcall(q_head, d)
    if not ok then
      if not d.new then dsave(d, now, lim) end
      error(e, 0)
    end
    h = e
    if h then candidate(h) end
  end
  if d.new then return end
  if defer and h then
    d.dirty = true
    if not LATE then LATE = {} end
    LATE[#LATE + 1] = d
  else
    dsave(d, now, lim)
  end
end

-- The same in place, with one BITFIELD that reads the version and nw and
-- takes one off each count: no unpacking, no packing, no TTL change (a
-- retirement never needs its domain's TTL renewed: the heartbeats and the
-- grants do that). 2.4 us where loading and saving took 3.8, here. A
-- domain this call has loaded goes through its table instead, which must
-- stay what Redis holds. So does one with waiters, as this server last saw
-- it (QH), where the save may be deferred: the handoff that follows loads
-- it anyway, and the BITFIELD would be a command more.
local function dreturn_fast(enc, ci, dr, db, now, lim, defer)
  local key = P .. 'd:' .. enc
  if DC[enc] or not STRUCT or (defer and QH[key]) then return dreturn(enc, ci, dr, db, now, lim, defer) end
  local r
  if dr and db then
    r = redis.pcall('BITFIELD', key, 'GET', 'i64', '#0', 'GET', 'i64', BFQ,
      'INCRBY', 'i64', BFC[ci], '-1', 'INCRBY', 'i64', BFB, '-1')
  elseif dr then
    r = redis.pcall('BITFIELD', key, 'GET', 'i64', '#0', 'GET', 'i64', BFQ, 'INCRBY', 'i64', BFC[ci], '-1')
  else
    r = redis.pcall('BITFIELD', key, 'GET', 'i64', '#0', 'GET', 'i64', BFQ, 'INCRBY', 'i64', BFB, '-1')
  end
  if r.err then
    -- The previous layout's hash: dload converts it.
    if not string.find(r.err, '^WRONGTYPE') then error(r) end
    return dreturn(enc, ci, dr, db, now, lim, defer)
  end
  if r[1] ~= DVERSION then
    -- Not this layout: BITFIELD made the key just now (it was missing), or
    -- it holds a value of a later version. Undo, and let dreturn see it.
    if r[1] == 0 then
      redis.call('DEL', key)
    elseif dr and db then
      redis.call('BITFIELD', key, 'INCRBY', 'i64', BFC[ci], 1, 'INCRBY', 'i64', BFB, 1)
    else
      redis.call('BITFIELD', key, 'INCRBY', 'i64', dr and BFC[ci] or BFB, 1)
    end
    return dreturn(enc, ci, dr, db, now, lim, defer)
  end
  -- A count below zero (its domain lost it) goes back to zero.
  if r[3] < 0 then redis.call('BITFIELD', key, 'SET', 'i64', dr and BFC[ci] or BFB, 0) end
  if r[4] and r[4] < 0 then redis.call('BITFIELD', key, 'SET', 'i64', BFB, 0) end
  if IN_LIBRARY and (r[2] > 0) ~= (QH[key] == true) then qh_note(key, r[2] > 0) end
  if r[2] > 0 then
    -- Waiters: the head is read from the domain's account of its queue.
    local h = q_head(dload(enc))
    if h then candidate(h) end
  end
end

-- Returns parts of lease lid of session sid (r, b are 0 or 1); the heads
-- of its queues become candidates. v is its record when the caller has
-- read it already (reclaim). defer lets a domain's save wait for the end
-- of the call (dreturn): only for a caller that returns through done
-- next. Returns the lease's record as it was (nil when unknown).
local function retire(lid, sid, r, b, v, defer)
  local lk = lxkey(sid)
  if not v then
    v = redis.call('HGET', lk, lid)
    if not v then return nil end
  end
  local l = lease_unpack(v)
  if not l then
    -- A waiter's marker is no lease (remove_waiter takes it out of line);
    -- only these scripts write lease records, and one they cannot read
    -- is dropped rather than kept forever.
    if string.byte(v, 1) ~= 87 then redis.call('HDEL', lk, lid) end
    return nil
  end
  local hr, hb = l.hr, l.hb
  local dr = (r == 1 and hr == 1)
  local db = (b == 1 and hb == 1)
  if defer and dr and Q.fast_handoff(lid, lk, l) then return l end
  if dr or db then
    local now, lim, ci = clock(), lims(), l.c + 1
    local es = split_encs(l.ds)
    for k = 1, #es do
      dreturn_fast(es[k], ci, dr, db, now, lim, defer)
    end
  end
  if dr then hr = 0 end
  if db then hb = 0 end
  if hr == 0 and hb == 0 then
    redis.call('HDEL', lk, lid)
  elseif dr or db then
    redis.call('HSET', lk, lid, lease_pack(hr, hb, l.c, l.g, l.sid, l.ds, l.cs))
  end
  return l
end

-- A request as the scripts see it: req = {id, encs, class, body, consumer,
-- ch, sid, ttl (us), handoff}, the caller's or (handoff set) a queued
-- waiter's stored one.

-- check reports, without changing counts, whether req fits now: slot when a
-- ceiling is full on a domain, and wait (us) for the rate or a pause.
-- Buckets are refilled on the domain tables (their only change).
local function check(req, doms, lim, now)
  local slot, wait = false, 0
  local ci = req.class + 1
  local cap = lim.caps[ci]
  for k = 1, #doms do
    local d = doms[k]
    settle(d, now, lim)
    if now < d.pu then wait = math.max(wait, d.pu - now) end
    if cap > 0 and d.f[ci] >= cap then slot = true end
    if req.body == 1 and lim.bodies > 0 and d.b >= lim.bodies then slot = true end
    local r, burst = rate(d, now, lim)
    if r > 0 then
      refill(d, now, r, burst)
      if d.tk < 1 then
        wait = math.max(wait, math.ceil((1 - d.tk) / r * 1000000))
      end
    end
  end
  return slot, wait
end

-- grant charges req to its domains and records the lease in its session
-- (Q.fast_handoff makes the usual handoff's grant itself: change both);
-- check has just refilled the buckets at now. A queued waiter (req.queued:
-- it heads every queue it is in) leaves them, in the same save of each
-- domain, and the new heads become candidates. Returns the time (us) the
-- lease has to live, or nil, having changed nothing, when req's session
-- is dead.
local function grant(req, doms, lim, now)
  -- (A call that has just read its session says what it has left.)
  local left = req.left or session(req.sid, req.ttl, now, req.handoff)
  if not left then return nil end
  local ci, queued = req.class + 1, req.queued
  for k = 1, #doms do
    local d = doms[k]
    d.f[ci] = d.f[ci] + 1
    if req.body == 1 then d.b = d.b + 1 end
    if d.bk == 1 then d.tk = d.tk - 1 end
    -- The measured start rate only serves a throttle on a domain with no
    -- rate ceiling (see budget/throttle.go).
    if lim.rps == 0 then
      -- A start history idle for START_MEMORY is forgotten: the
      -- measurement starts again, bias correction and all, as on a fresh
      -- domain (memStore deletes such a domain when it sweeps).
      if d.fs == 0 or now - d.sa >= START_MEMORY then d.fs, d.ss = now, 0 end
      d.ss = decay(d.ss, (now - d.sa) / 1000000) + 1 / TAU
      d.sa = now
    end
    if queued then
      local h = q_head(d)
      if h and h.id == req.id then
        q_pop(d, h, k > 1)
        h = q_head(d)
        if h then candidate(h) end
      end
    end
    dsave(d, now, lim)
  end
  -- The lease takes the marker's field, if it had one.
  local encs = req.encs
  lease_put(req.sid, req.id, lease_pack(1, req.body, req.class, now, req.sid,
    #encs == 1 and encs[1] or table.concat(encs, ','), req.consumer))
  return left
end

-- decide is the one admission decision for a waiter that heads all its
-- queues (or has none), made on its own call (acquire) or on its behalf
-- (try_grant): it grants when everything fits. Returns 'granted' and the
-- time the lease has to live (us), 'wait' and the wait in us (the rate or
-- a pause), 'blocked' (a ceiling), or 'gone' (it fits, but its session is
-- dead). Mirrors memStore.attempt.
local function decide(req, doms, lim, now)
  local slot, wait = check(req, doms, lim, now)
  if slot then return 'blocked', 0 end
  if wait > 0 then return 'wait', wait end
  local left = grant(req, doms, lim, now)
  if not left then return 'gone', 0 end
  return 'granted', left
end

-- The run_id of the Redis running this script, or nil where INFO is not
-- available in Lua (miniredis). INFO costs about 10us; a run_id never
-- changes while a server runs, so a library reads it once (MYRID). Unlike
-- the config's rid, which replicas copy, a library's variables belong to
-- the server that runs it: a promoted replica's MYRID is its own run_id.
local MYRID
local function server_rid()
  if MYRID then return MYRID end
  local ok, info = pcall(redis.call, 'INFO', 'server')
  if not ok or type(info) ~= 'string' then return nil end
  local rid = string.match(info, 'run_id:(%x+)')
  if IN_LIBRARY then MYRID = rid end
  return rid
end

-- Reports whether the budget's data was written by another Redis than the
-- one running this script: a restart from disk (AOF or RDB) or a replica
-- promoted after its master died. Writes of the last moments before may be
-- missing (the replica never got them), so the counts cannot be trusted as
-- they are. Without a library every check pays for INFO, so only the
-- register, heartbeat and throttle scripts ask; miniredis (no INFO in Lua)
-- never reports a restart.
local function restarted()
  local rid = server_rid()
  if not rid then return false end
  local known = redis.call('HGET', CFG, 'rid')
  if known == rid then return false end
  cfg_put('rid', rid)
  return known ~= false
end

-- Starts a new epoch under quarantine: every live holder re-asserts its
-- leases (it sees the epoch change on its next heartbeat) before any new
-- grant trusts the counts. rebuild says the counts cannot be trusted even
-- then (keys may have expired apart, Clock jumps): lease records, queues
-- and waiters are dropped, and domains' counts read as zero until
-- re-assertion counts them again (waiters join the queues again on their
-- next call). Work in the number of domains and waiters, on a rare call.
local function new_epoch(now, quarantine_us, rebuild)
  local e = math.max(now, (tonumber(redis.call('HGET', CFG, 'epoch')) or 0) + 1)
  local f = {'epoch', e, 'qu', now + quarantine_us}
  if rebuild then
    f[#f + 1], f[#f + 2] = 'ce', e
    -- The new ce puts every lease record and waiter's marker out of
    -- reach (lxkey); those of the sessions known go now rather than with
    -- their TTL. Queues go too, and a domain of the old epoch reads as
    -- one with none (dload).
    for _, sid in ipairs(redis.call('ZRANGE', K.sexp, 0, -1)) do
      redis.call('DEL', lxkey(sid))
    end
    for _, enc in ipairs(redis.call('ZRANGE', P .. 'doms', 0, -1)) do
      redis.call('DEL', P .. 'q:' .. enc)
    end
    BATCH.flush()
    HEADS, QBUF = {}, {}
    DC = {}
  end
  cfg_put(unpack(f))
  return I(e)
end

-- vouch runs before a grant (acquire, and a handoff to a queued waiter):
-- in a library, where the config's rid comes with the limits and the
-- server's own is cached, it costs a comparison, so every grant checks
-- that this server wrote the counts it trusts. The first call of a group
-- on a promoted replica or a restarted server then starts the new epoch
-- itself, before it grants, instead of leaving that to the next heartbeat
-- (by then the stale counts may have admitted above the ceiling). The
-- quarantine is one TTL of the waiter at hand. Through EVALSHA the check
-- would cost INFO on every call, so there it stays with the heartbeat.
local function vouch(lim, now, quarantine_us)
  if not IN_LIBRARY then return end
  local rid = server_rid()
  if not rid or lim.rid == rid then return end
  if restarted() then
    new_epoch(now, quarantine_us)
  else
    cfg_put('rid', rid) -- the field had it and pc did not: pc learns it
  end
end

-- Tells queued waiter e (an entry) it was granted, its session having
-- left (us) to live (see try_grant).
function Q.tell_granted(e, left)
  local short = e.ttl - left
  if short < 0 then short = 0 end
  redis.call(PUB, P .. 'wake:' .. e.ch, 'granted ' .. e.id .. ' ' .. e.sid .. ' ' .. I(short))
end

-- try_grant admits queued waiter e (an entry, as read from a queue's head)
-- on its stored request if it heads all its queues and fits now, and
-- tells it so. Returns 'granted', 'wait' (held back by the rate or a
-- pause), 'blocked' (a ceiling), 'no' (not a head of every queue), or
-- 'unknown' (its session is dead, or the budget gone: just wake it, and
-- its own call sorts it out).
local function try_grant(e, now)
  local lim = lims()
  if not lim then return 'unknown' end
  vouch(lim, now, e.ttl)
  -- No grant while the budget is quarantined after a state loss (waiters
  -- can survive a restart from AOF); the waiter learns how long from its
  -- own call, which the quarantine delays.
  if now < lim.qu then return 'wait' end
  -- The usual try after a handoff: the next head, on one domain this
  -- call has loaded and saved, behind the waiter that just took the last
  -- slot of its class. decide would say 'blocked', and with no rate to
  -- refill and no throttle to settle, its check would change nothing
  -- (memStore.check's only writes) and nothing would be saved, so it is
  -- said without building the request.
  if e.ds == '' and lim.rps == 0 then
    local d = DC[e.enc]
    local cap = lim.caps[e.c + 1]
    if d and cap > 0 and d.f[e.c + 1] >= cap and d.th ~= 1 and not d.dirty and not d.rf and HEADS[d.q] == e then
      return 'blocked'
    end
  end
  local encs = split_encs(e.ds ~= '' and e.ds or e.enc)
  -- One request and one domain list serve every try of the call: nothing
  -- keeps them past decide (see DPOOL for why tables are reused), and
  -- acquire's own (REUSE.areq, .adoms) stay in use while it hands off.
  local doms = REUSE.hdoms
  for k = #doms, #encs + 1, -1 do doms[k] = nil end
  for k = 1, #encs do
    local d = dload(encs[k])
    local h = q_head(d)
    if not h or h.id ~= e.id then return 'no' end
    doms[k] = d
  end
  local req = REUSE.hreq
  req.id, req.encs, req.class, req.body, req.consumer = e.id, encs, e.c, e.b, e.cs
  req.ch, req.ttl, req.sid, req.handoff, req.queued, req.left = e.ch, e.ttl, e.sid, true, true, false
  local r, left = decide(req, doms, lim, now)
  if r ~= 'granted' then
    -- Keep what check refilled, as memStore keeps every refill its
    -- checks make. Where the rate changes with time (a throttled domain,
    -- its factor climbing back) when refills happen changes the tokens.
    -- At a constant rate a refill now or later comes to the same, but
    -- only while time goes forward: after TIME steps back the group clock
    -- resumes from its anchor, up to a second before the latest time read
    -- (group_clock), and a bucket refilled after the anchor and not kept
    -- would lose what that refill credited until the clock passed it
    -- again (the long differential test found it). A head passed over
    -- marked entries moved too.
    for k = 1, #doms do
      local d = doms[k]
      if d.th == 1 or d.rf or d.dirty then dsave(d, now, lim) end
    end
    if r == 'gone' then return 'unknown' end
    return r
  end
  -- The message carries the grant, its session, and how much less than a
  -- TTL its session had left: the waiter need not call to learn it (if
  -- the message is lost, its next call finds the lease). The waiter knows
  -- when it sent its calls, and Redis ran this after any of them that
  -- found it queued, so counting the lease's TTL from one of them, less
  -- that, never counts past the session's deadline.
  Q.tell_granted(e, left)
  return 'granted'
end

-- done hands free capacity to the candidates (hand_off), in bounded work,
-- and wakes those that must hear of a change; every script returns
-- through it.
local HANDOFF = 32
local function hand_off(now)
  if not CANDS then return end
  local i, granted = 1, 0
  while i <= #CANDS do
    local e = CANDS[i]
    i = i + 1
    PENDING[e.id] = nil
    if granted >= HANDOFF then
      wake(e) -- past the bound: let it call for itself
    else
      local r = try_grant(e, now)
      if r == 'granted' then
        granted = granted + 1
      elseif r == 'wait' or r == 'unknown' then
        wake(e)
      end
    end
  end
end

local function done(result)
  local now = clock()
  if not LATE then
    hand_off(now)
    return result
  end
  -- What a retirement left to save (dreturn) is saved here unless a grant
  -- saved it, even when the handoff fails (a key of the wrong type, put
  -- there by hand): a script's writes stay when it fails, and the
  -- retirement must be among them, as when it wrote at once. Without
  -- candidates there is nothing to fail.
  local ok, err = true, nil
  if CANDS then ok, err = pcall(hand_off, now) end
  if LATE then
    local lim = lims()
    for k = 1, #LATE do
      local d = LATE[k]
      if d.dirty then dsave(d, now, lim) end
    end
    LATE = nil
  end
  if not ok then error(err, 0) end
  return result
end

-- Q.fast_handoff is the rest of retire, and done, for the one retirement
-- that under contention is nearly every one: lease lid (record l, in
-- session hash lk) gives back its request slot, and no body, on one domain
-- with no rate, no throttle, no pause and no quarantine, whose line's head
-- waits for a slot of the same class, without a body and on that domain
-- alone, in a live session; the grant fills the ceiling again, and the next
-- head, if any, is of the same class on that domain alone, so the ceiling
-- holds it back. It writes what the general path writes, in the same order
-- (the record's HDEL, the domain's save, the head's lease, the granted
-- message), and leaves the call's state (DC, HEADS, the batch's pending
-- writes) as that path would, without its deferred save, request table,
-- candidate list, decide and check around a grant that cannot fail, and a
-- try of the next head that can only say blocked: about 6% of a handing-off
-- retire's instructions and 4.5% of a batched release and join, by
-- callgrind (BENCHMARKS, session 27). It decides from reads alone, and
-- where anything differs returns false having written nothing and changed
-- nothing the general path would not (the domain it loaded stays loaded:
-- that path loads it too), and the general path goes on;
-- TestFastHandoffMatchesGeneral runs both on twin budgets, and
-- TestFastHandoffInBatches a batch of several retirements and joins against
-- the same operations alone: in a batch the retirements after the first
-- find the domain loaded (DC) and the next head read, which the short path
-- leaves behind it (the head it read before the pop, unless a compaction
-- moved the line). A domain this server has not seen waiters on (QH) is
-- left to the general path unread, so an uncontended release pays a lookup.
-- Only in a library, where vouch's check costs a comparison. (In Q, not a
-- local of its own: the chunk's 200 locals are nearly all taken.)
function Q.fast_handoff(lid, lk, l)
  if not (IN_LIBRARY and STRUCT) or CANDS or LATE or l.hb ~= 0 then return false end
  local es = split_encs(l.ds)
  local enc = es[1]
  if #es ~= 1 or not QH[P .. 'd:' .. enc] then return false end
  -- A domain an earlier operation of the batch loaded is as good as one
  -- read now, unless something changed it and did not save it yet.
  local dc = DC[enc]
  if dc and (dc.dirty or dc.rf) then return false end
  local now, lim = clock(), lims()
  if not lim or lim.rps ~= 0 or now < lim.qu then return false end
  local rid = server_rid()
  if not rid or lim.rid ~= rid then return false end
  local ci = l.c + 1
  local cap = lim.caps[ci]
  if cap <= 0 then return false end
  local d = dload(enc)
  if d.new or d.dirty or d.th == 1 or d.bk == 1 or d.pu > now or d.f[ci] ~= cap or d.nw <= 0 then return false end
  local ok, h = pcall(q_head, d)
  if not (ok and h and h.ds == '' and h.c == l.c and h.b == 0) then return false end
  -- The entry after the head is the next head once the head leaves
  -- (read again if a compaction moves it).
  local nx
  if d.nw > 1 then
    nx = q_at(d, h.off + h.len)
    if not nx or nx.dead ~= 0 or nx.ds ~= '' or nx.c ~= l.c then return false end
  end
  local left = session(h.sid, h.ttl, now, true)
  if not left then return false end
  redis.call('HDEL', lk, lid)
  -- The grant, as grant() makes it for a queued waiter (change both
  -- together): the count the lease gave back is taken again, the start
  -- rate counts a start, the head leaves the line (the next one is read
  -- for the batch's next operation, as grant reads it), the domain is
  -- saved, the lease written and the waiter told. No candidate is left
  -- for done: the next head, held back by the ceiling, is all there was.
  if d.fs == 0 or now - d.sa >= START_MEMORY then d.fs, d.ss = now, 0 end
  d.ss = decay(d.ss, (now - d.sa) / 1000000) + 1 / TAU
  d.sa = now
  q_pop(d, h, false)
  -- The next head is the entry read above (q_head would parse it again:
  -- 11k instructions), unless compaction moved it.
  if nx and d.qh == nx.off then HEADS[d.q] = nx else q_head(d) end
  dsave(d, now, lim)
  lease_put(h.sid, h.id, lease_pack(1, 0, h.c, now, h.sid, enc, h.cs))
  Q.tell_granted(h, left)
  return true
end

-- Reclaims, in bounded work, the leases of dead sessions and the waiters
-- whose holders stopped renewing them. Every script runs it, so no daemon
-- is needed; it scans only once the config's rc is reached (a deadline may
-- have passed), and then sets rc to the earliest deadline left, or a
-- second from now if that is sooner. A dead session's leases are retired
-- RECLAIM per script, in all; a session with some left keeps its past
-- deadline, so rc stays behind now and the next script goes on, and one
-- found empty is ended. Renewals only push deadlines later, so rc stays a
-- lower bound between scans; the one-second cap bounds the delay for
-- deadlines written without lowering rc (a hand edit), for a scan a second.
local RECLAIM = 16
local RESCAN = 1000000 -- us
local function reclaim(now)
  local lim = lims()
  if lim and now < lim.rc then return end
  local sexp = K.sexp
  local left = RECLAIM
  local sids = redis.call('ZRANGEBYSCORE', sexp, '-inf', I(now), 'LIMIT', 0, RECLAIM)
  for _, sid in ipairs(sids) do
    if left == 0 then break end
    local lk = lxkey(sid)
    local empty = false
    -- One field more than is left to retire: the empty one (lease_put)
    -- may come out with the leases. A reply shorter than asked holds every
    -- field the hash had, so the session's leases are all retired then.
    while left > 0 and not empty do
      local asked = left + 1
      local kv = redis.call('HRANDFIELD', lk, asked, 'WITHVALUES')
      for k = 1, #kv, 2 do
        if kv[k] ~= '' then
          local v = kv[k + 1]
          -- A waiter of the dead session goes with it (Queues).
          if string.byte(v, 1) == 87 then unqueue(kv[k], sid, v) else retire(kv[k], sid, 1, 1, v) end
          left = left - 1
          if left == 0 then break end
        end
      end
      empty = #kv < 2 * asked
    end
    if empty then end_session(sid, now) end
  end
  if lim then
    -- With work left, the head is still due and the next script goes on.
    local rc = now + RESCAN
    local h = redis.call('ZRANGE', sexp, '0', '0', 'WITHSCORES')
    if h[2] then rc = math.min(rc, tonumber(h[2])) end
    cfg_put('rc', rc)
  end
end

-- Reports, without noting it, whether Redis's run_id differs from the one
-- that wrote the config (restarted() notes it, and starts the epoch).
local function run_id_changed()
  local rid = server_rid()
  if not rid then return false end
  local known = redis.call('HGET', CFG, 'rid')
  return known ~= false and known ~= rid
end

-- The group clock (Clock jumps, above). STEP bounds how far lt may lag the
-- latest time read (a write a second, not one a call); a step back of less
-- than that goes unnoticed, and costs at most that. KEYRISK is the least
-- TTL a key in use has left (an eighth of the idle TTL: domain hashes are
-- renewed when half spent, and checked by heartbeats every quarter), so a
-- smaller jump expires none.
local STEP = 1000000 -- us

-- Whether any session holds a lease: its key has a field besides the
-- empty one (lease_put). Read only after a silence longer than J, for
-- up to 64 sessions; a group with more is taken to hold some.
local function leases_held()
  local ss = redis.call('ZRANGE', K.sexp, 0, 63)
  for i = 1, #ss do
    if redis.call('HLEN', lxkey(ss[i])) > 1 then return true end
  end
  return #ss >= 64
end

local function group_clock(raw)
  local lim = lims()
  if not lim then return raw end
  local now, lt, co = raw + lim.co, lim.lt, lim.co
  local tl = lim.tl > 0 and lim.tl or IDLE * 50 -- what the idle TTL says
  local j = tl / 2
  j = j - j % 1
  local rebuild = false
  local back = false
  if lt > 0 and now < lt then
    BACK, EXPMS = lt - now, nil -- deadlines set from now on add BACK
    co = co + BACK
    now = lt
    back = true
  elseif lt > 0 and now - lt > j and leases_held() then
    local gap = now - lt
    rebuild = gap >= IDLE * 125
    if not run_id_changed() then
      co = co - (gap - j)
      now = lt + j
    end
  end
  local q = j / 4
  q = q - q % 1
  local newlt = now > lt + (STEP < q and STEP or q)
  if co ~= lim.co then
    if newlt then cfg_put('co', co, 'lt', now) else cfg_put('co', co) end
  elseif newlt then
    cfg_put('lt', now)
  end
  if back then
    -- Keys renewed from now on expire earlier, by Redis's clock, than
    -- the config renewed before: the next call renews it, and the keys it
    -- vouches for, with them (touch_cfg), so that the config still never
    -- outlives the records.
    touch_cfg()
  end
  if rebuild then new_epoch(now, tl, true) end
  return now
end

-- The call's now: the group clock, read once per call.
function clock()
  if not NOW then NOW = group_clock(raw_clock()) end
  return NOW
end
