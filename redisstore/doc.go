// Package redisstore keeps a runbudget budget in Redis, so that every host of
// a run draws on one shared budget, and provides a Redis-backed rate check for
// the admission package.
//
// # State and scripts
//
// Every change to a budget is one Lua script from package luascripts,
// reading Redis TIME once: no host's clock takes part in a decision, so
// hosts with skewed clocks share one budget correctly. On Redis 7 the
// scripts run as one function library (FUNCTION LOAD once per server, by
// New, and again when a call finds it missing after a restart or a flush;
// then FCALL), since a script sent by EVALSHA rebuilds its shared helpers
// on every call: about 20 us of a 120 us admission on a loaded 2-core
// machine. Where functions are not available (miniredis, older servers, an
// ACL that refuses FUNCTION) the same scripts run by EVALSHA, reloaded on
// NOSCRIPT. Each library's name carries a hash of its code, so hosts of
// different versions can share one Redis; Admin.Libraries lists them and
// Admin.PruneLibraries (budgetctl libraries --prune) deletes those of other
// builds, which is safe while their hosts run: they load theirs again. The scripts keep the same state as the in-process store
// and take the same decisions; the conformance suite in budget/budgettest
// runs against both, on miniredis, a real redis-server and a Redis Cluster.
//
// All keys of a budget start with "rb:{<hex of its name>}:", so the name is
// the hash tag and the whole budget sits in one Cluster slot, and domain IDs
// appear in keys as "<version>.<hex of the ID>": any bytes, injectively.
// Memory is not among them: it is each host's own, kept by the Budget, and
// Redis holds only the ceilings every host shares.
//
// # Shard groups
//
// One slot is one Redis core for every admission of the run. WithShardKey
// splits a budget into groups: domains with equal keys share one, whose
// keys start "rb:{<hex of name>.<hex of key>}:" (hex has no ".", so the pair
// is recovered exactly and never collides with another pair or with the
// unsharded name). A group is what a whole budget is without sharding (its
// own config, queues, domains, leases and wake channel), so FIFO
// and multi-domain atomicity hold within a group, a request must stay in
// one, and groups on different Cluster masters admit in parallel.
//
// A host sets a group up on first use: it subscribes to its wake channel
// there, registers (or checks) its limits in it, and lists it in the
// budget's registry, a zset in the slot of the name that also holds the
// limits (so a host with other limits is refused before any group exists).
// Usage, Admin, budgetctl and the metrics exporter read the registry, then
// call each group side by side: no keyspace scan. What a host pays per
// group it uses: one subscribed channel on the pub/sub connection of the
// group's server (one connection per server, per master on a Cluster,
// however many groups), one heartbeat call per TTL/3 while it holds leases
// there, one renew call per TTL/3 while it has waiters queued there, a
// registry refresh per quarter idle TTL, and a few hundred bytes of
// bookkeeping.
//
// Waiter and lease IDs are chosen by the client before each call, and every
// script is idempotent by ID: a call repeated by go-redis after a lost reply
// returns the same grant, a repeated release changes nothing, and a waiter
// that gives up (or whose call timed out) is cancelled by ID, returning any
// grant made under it.
//
// # Group commit
//
// While one call of this process to a group is in flight, its further
// acquire attempts (a waiter's later calls too), retirements and
// cancellations for that group queue, and go together in the next call:
// one FCALL of a batch function that runs each operation's script in turn
// (luascripts' batch.lua), each with its own arguments, reply and error.
// When a call returns, its caller hands the lead to the first one queued,
// which sends the whole queue (up to 32, in the order they came); there is
// no timer, and an idle group sends a call at once, alone, as before.
// Under contention the fixed cost of a call (the round trip, both sides'
// syscalls, the FCALL) and the reads of the limits and domains are paid
// once per batch instead of once per operation. So are the writes: an
// operation reads what the ones before it in the batch read or wrote
// (a domain, a queue's head, a session's deadline), and each domain is
// written once, at the batch's end, as the last operation that ended
// well left it. A join behind a head the batch has read takes its place
// with two commands.
//
// A lease's last retirement (Release, or the last of its parts) that finds
// a call in flight does not wait for its reply: it queues and returns at
// once, and a goroutine of the store leads its batch when no caller queued
// can. A lane that releases and asks again at once then sends both in one
// call. Until that call is answered, other processes may still count the
// lease; Store.Flush waits for what was queued, and Usage and Close flush
// first. One that Redis refuses is retired by the group's next heartbeat
// (the lease is reclaimed with its session otherwise).
//
// Each operation is still its own atomic step (a batch runs whole, which is
// stronger). One refused by its script (a malformed argument) fails alone;
// a call that fails on the network fails each of its operations with the
// same error. A caller whose ctx ends while queued leaves the queue with
// nothing sent; one whose operation is on its way returns ctx.Err(), as
// after a timed-out call, and its waiter is cleaned up by ID as after a
// lost reply. Out of memory, Redis refuses a batch that carries an
// admitting call whole, as it would that call alone; the batch's
// retirements and cancellations go again in an allow-oom batch function
// and free their slots. Wake messages published by a batch's operations go
// out when the whole batch ends. By EVALSHA nothing is batched. A call out
// for more than 100 ms (go-redis redialling a dead master, a connection
// that died without a reset) no longer holds up the calls behind it: the
// next one goes beside it, with whatever is queued, except calls for the id
// of a caller that left while its own was in that call, which wait for it.
//
// # Sessions, expiry and reclaim
//
// A lease has no deadline of its own. A process holds one session in each
// group where it holds leases (its id is the process's name and a
// generation), every lease names its session, and the session's deadline
// is theirs: the keeper's one heartbeat call per group every TTL/3 (see
// lease.Keeper) renews the session with a few commands, whatever the
// number of leases in it (P5 in BENCHMARKS.md). Waiters keep deadlines of
// their own, a TTL after the latest renewal of each, and their calls renew
// them; but a waiter blocked by a ceiling has nothing else to ask, and with
// many lanes waiting those calls were most of Redis's work (P9). So the
// store renews its queued waiters itself: one renew call per group every
// TTL/3, whatever their number, which pushes each deadline still in place
// a TTL on (one that has passed stays passed) and says which of them were
// granted meanwhile or are gone, and those are woken; those that head a
// queue are tried as a release's handoff would try them. The Budget then
// calls for a waiter only on a wake, after a timed delay, or every three
// TTLs as a safety net (budget.Attempt.Renewed). A process that dies stops
// renewing, and its waiters' places are reclaimed a TTL after the last
// renewal, as when each renewed itself.
//
// A session whose deadline passed is dead for good. The holder learns it
// from its next call (a heartbeat, or a grant the script refuses), and
// every lease of it is lost: the next Heartbeat reports them all missing,
// so each one's Lost() fires, and the store starts the next generation.
// Every script first reclaims, oldest first, up to 16 leases of dead
// sessions (continuing on the next script where a session has more, and
// then ending it) and 16 expired waiters: no daemon is needed, and no call
// does unbounded work. The budget's config keeps a time no later than the
// earliest session or waiter deadline (every new deadline can only move it
// earlier), so a script scans only when something may have expired, and
// at least once a second while scripts run.
//
// With one deadline for many leases, a lease its holder stops renewing no
// longer expires by itself, so the store does what per-lease deadlines
// did: a lease its keeper has not listed in a heartbeat for a TTL (it was
// declared lost, or released while Redis was unreachable), and a grant
// whose reply and cancellation both failed, are cancelled by the group's
// next heartbeat. A lease an operator drops (Admin.DropLeases) is noted in
// its session; the holder's next heartbeat hears of it, and its Lost()
// fires.
//
// A grant joins the session without renewing it, unless less than two
// thirds of a TTL is left, and reports as the lease's age the part of the
// session's TTL already spent, so a keeper never counts a lease alive
// past its session's deadline. A queued waiter belongs to a session too:
// its place in line lives as long as the session (its process renews the
// session by its heartbeats, or, holding no lease there, by its waiters'
// renewals), and reclaim takes the waiters of a dead session out of line
// with its leases. A handoff (below) grants into the waiter's session as
// it is, never extending it (a dead process's waiters must not keep its
// session alive by being granted), and reports how much less than a TTL
// the session has left: the waiter counts from a call it sent, which it
// can time, less that, or from its session's last confirmed renewal,
// whichever is later, and never from after its call (an age since the
// grant would have to be counted from that call as well, twice: under
// load a waiter last heard of a third of a TTL before its grant got a
// lease its keeper gave up at once, or refused as stale). Hosts of this version and older ones (with
// a deadline per lease) keep leases in different keys, so they must not
// share a budget: a rolling upgrade needs a new budget name, or a stop.
// The same holds for the packed domain keys (one string per domain, where
// builds before it kept a hash): this build converts a domain hash it
// finds, counts and TTL kept, so a budget left by an older build (stopped
// first) carries on; an older host still running fails closed on a
// converted domain (Redis answers WRONGTYPE, which it reports as
// ErrUnavailable) rather than counting beside this one.
//
// A budget's config names the layout its keys are kept in (absent: layout
// 1), and a build refuses a budget kept in a newer layout than it reads,
// before it touches anything: every call fails with an error wrapping
// budget.ErrLimitsConflict that names both layouts. Builds that read
// layouts did so from layout 1 on; hosts of builds before them cannot
// tell, and must be stopped first.
//
// This build keeps layout 3. Each session's leases are one hash of their
// own (layout 2; layout 1 kept every lease of a group in one hash beside
// a set of lease ids per session), so a grant writes one field and a
// release reads and deletes one. The hash's name carries the epoch the
// counts are of, so a state loss or a clock jump that wipes the counts
// leaves the old records unreadable. Each domain's queue is one string of
// entries, each a waiter's whole record, in the order their joins ran
// (layouts 1 and 2 kept a sorted set of waiter ids by ticket, a key per
// waiter and a deadline per waiter), and the waiter's marker in its
// session's hash says where its entries are: a join behind others is one
// BITFIELD (its place, counted in its domain's value), one HSETNX and one
// APPEND, and a handoff reads the head and the waiter after it with one
// GETRANGE (BENCHMARKS.md, layout 3). The first call of this build on a
// budget in layout 1 or 2 converts it in one step, leases, waiters and
// places in line kept, and names layout 3 with the limits' JSON changed
// in its bytes (the layout put first): hosts of the older build then
// re-read the layout and fail closed, so upgrade every host of a run
// together.
//
// Keys expire after max(20 x TTL, 5 min) without use, so an idle budget
// leaves nothing behind; a domain's key lives at least until its bucket is
// full again, so an expired domain is exactly a fresh one. Idle TTLs are
// renewed when half spent rather than on every touch; those of a
// session's keys and of the domain keys its leases count in, by a
// heartbeat once a quarter of the idle TTL. Keys that live beside another
// follow it instead of being renewed on their own: a domain's queue is
// renewed with the domain, the sessions' hashes (and the waiters' markers
// in them) with the budget's config, so a waiter that joins behind
// another renews no TTL at all. On a
// loaded machine each command inside a script costs a microsecond or more.
//
// # Wake events
//
// A waiter that cannot move sleeps until an event says it may. The script
// whose change could let waiters move (a release, a waiter leaving its
// queues, new limits) grants them itself, in arrival order, before it
// returns: the new head of each affected queue, as many as fit (at most 32
// per call). The usual case under contention (a slot on one domain handed
// to a head of its own class, the next head held back by the same
// ceiling) takes a short path in the library that makes the same writes
// with less work (lib.lua, Q.fast_handoff), for every retirement of a
// batch, each leaving the next head it read to the operations after it.
// This handoff matters: if each new head had to be woken and call for
// itself, admissions would follow one another at one wake-and-call each,
// whatever the number of free slots (a measured 1 of 8 slots in use with
// 64 lanes). Scripts publish on the
// waiter's process channel (SPUBLISH on a Cluster, so the message stays on
// the shard of the group's slot) "granted <id> <session> <short>" for a
// waiter they granted (the session it joined, and how much less than a
// TTL that session had left), which then returns from Acquire
// with no further call, or "<id>" for one
// held back by time (the rate or a pause), which calls to learn how long
// to sleep. One held back by a ceiling stays asleep until a release tries
// it again. Under 64-way contention on 8 slots that is one wake message and
// two script calls (its first, queued call and its release) per admitted
// request, the same as with 16 lanes. A grant whose message is lost on the
// way costs at most TTL/3: the next renewal finds the lease and wakes the
// waiter, whose call collects it. A renewal also tries those of its
// waiters that head a queue as a handoff would, so a lost message for a
// head held back by time ("<id>") is sent again, or the head granted,
// within TTL/3 too. Usually far less: once a hub has its channels subscribed again
// (after a reconnect, or on the new master after the group's slot moved,
// which Redis announces with a sunsubscribe push), it wakes that group's
// waiters, so each calls at once. On a Cluster every call also names a key
// no script writes (slotGuard), so while a group's slot migrates Redis
// refuses the call whole (TRYAGAIN, ASK), and it is retried, instead of
// running it half on either master. The new master did not write the
// group's config, so the first grant on it quarantines the group for one
// lease TTL, as after a failover.
//
// Pub/sub was chosen over a blocking list per waiter (BLPOP) on measurement:
// a bare handoff on loopback costs about the same (92-108 us for pub/sub,
// 113-119 us for BLPOP in the same run; BenchmarkWakeFloor*), but BLPOP
// holds one connection per waiting lane, which exhausts a client pool when
// lanes outnumber connections, while pub/sub needs one connection per
// process whatever the number of waiters. A list would also keep wake
// entries for waiters that already left.
//
// # Failure
//
// Nothing is admitted without Redis, nor by a Redis that is out of memory:
// on Redis 7 every script declares its flags in a shebang line, so with
// maxmemory reached (noeviction) an admitting script is refused as a whole,
// never half-applied, while retirements, heartbeats and cancellations
// (flagged allow-oom) still run and free what they hold. Servers without
// shebang support (before 7, miniredis) get the same scripts without it.
//
// If Redis loses the budget (restarted empty, or from a persistence file
// or a promoted replica that may miss the last writes), the first host to
// notice starts a new epoch under a quarantine of one lease TTL: no grant
// trusts the counts until every live holder has put its leases back, which
// each does at its next heartbeat. A stale copy is told apart by the run_id
// of the Redis that wrote the group, kept in its config: on Redis 7 (the
// function library) every grant compares it with the server's own, so the
// first call that would grant on a restarted server or a promoted replica
// quarantines the group before it grants. Through EVALSHA (older servers)
// that check would cost an INFO per call, so only register, heartbeat and
// throttle make it, and grants before the holders' next heartbeat trust
// the stale counts. A budget lost outright (restarted empty) looks new to
// a host that joins only after the loss; it may be admitted until the
// holders' next heartbeat, which then quarantines the budget. Hosts of one
// budget should use the same lease TTL, since the quarantine lasts one TTL
// of the host that noticed.
//
// Redis TIME can jump (a clock stepped by hand or by NTP, a VM restored).
// The scripts keep each group on a clock of its own, TIME plus an offset
// stored in its config, that never runs back: when TIME goes back, the
// group goes on from the latest time it read, so buckets keep refilling
// and deadlines and pauses end when they would have. When TIME moves more
// than half a lease TTL (the longest registered) past that time while
// leases are held, either every holder went silent or TIME jumped, which
// Redis cannot tell apart; the group's clock then moves half a TTL only,
// so no live holder's session expires (it beats again within a third) and
// a dead one's slots come back at most a TTL later. A restarted server or
// a promoted replica (another run_id) is trusted: real time passed there.
// A jump of an eighth of the idle TTL or more may also have expired keys
// one by one (key TTLs follow Redis's wall clock), so it starts a new epoch
// under quarantine in which counts are rebuilt from the holders'
// re-assertions alone; waiters join the line again. Without leases held a
// jump forward is taken as time passed (a bucket fills, a pause ends
// early). FAULTS.md, scenario 22, moves a real server's clock.
//
// The config's fields that every call reads (the quarantine's end, the
// clock's offset, reclaim's next due time and the others) are also kept
// packed in one field, pc, which the scripts read in their place and
// rewrite with every change: seven numbers unpacked cost less than seven
// decimals parsed. An operator who edits one of those fields by hand
// should delete pc in the same MULTI, so that the scripts read the fields
// (and write pc again at their next change). A host of a build before pc
// writes the fields alone: one more reason hosts of different builds must
// not share a budget (above).
//
// Nothing is admitted without Redis. A call that fails on the network, on
// BUSY, OOM, LOADING or a failover returns an error wrapping
// budget.ErrUnavailable, which the budget retries within its grace. Errors
// carry go-redis's text, never the client's credentials. New refuses a
// client without ContextTimeoutEnabled (a hung Redis must not outlast a
// caller's deadline) and a Redis whose maxmemory-policy could evict lease
// keys.
//
// # Failover and client options
//
// When the master holding a group dies, its replica is promoted (Cluster
// or Sentinel) and the budget admits again once the client reaches it. A
// ClusterClient learns of a promotion only from a MOVED reply or its
// periodic reload (every minute), and a master killed outright sends no
// MOVED, so the store asks the client to reload its slot map after a call
// fails in a way a changed topology explains (go-redis runs one reload at a
// time, 200 ms apart, however many lanes fail). Measured on a 3x1 Cluster
// with a 1 s node timeout: first grant 2.1-2.6 s after kill -9 (FAULTS.md,
// scenario 18). Options worth setting on the client:
//   - ContextTimeoutEnabled: true (required).
//   - PoolSize of about ten per lane that shares the client, on a
//     FailoverClient or ClusterClient: go-redis stops dialling a server
//     for a second once PoolSize dials in a row have failed, which the
//     default trips during a failover, delaying the first call after the
//     switch by up to a second (Sentinel, scenario 19: first grant
//     2.3-3.1 s with the default, 2.2-2.3 s with ten per lane).
//   - maxclients on every Redis server at least (PoolSize + 1) x the
//     hosts that reach it: each store holds a pub/sub connection, which
//     go-redis redials at once, while command connections are dialled on
//     demand. Below one free connection per host, the hosts' pub/sub
//     connections take the room and no call gets through until
//     connections free up (scenario 23). A store whose connections Redis
//     refuses for maxclients says so in its errors, which go-redis alone
//     reports as a broken pipe or a timeout.
//   - A short lease TTL (WithLeaseTTL) when fast recovery matters: a
//     promoted replica is a new server, so the budget is quarantined for
//     one TTL after a failover (see Failure above).
package redisstore
