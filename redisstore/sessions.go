package redisstore

import (
	"strconv"
	"time"
)

// Sessions. A process holds one session per group it uses (lib.lua,
// Sessions): its leases there live as long as the session does, and one
// heartbeat call per interval renews the session, whatever the number of
// leases in it. The session's id is the process's name and a generation,
// chosen here, so every call that names it is idempotent. A session is
// dead once Redis finds its deadline passed: no grant joins it and no beat
// renews it, and a call that names it hears so (errSessionGone, or a
// heartbeat's gone). The store then starts the next generation, and every
// lease it held in the dead one is lost: the next Heartbeat reports it
// missing, so its holder's Lost() fires.
//
// The store also gives a session up by itself when no call has confirmed
// it for a TTL (renewed below): Redis may have expired it by then, and
// every lease of it has been declared lost by its keeper, whose count of
// the TTL never starts later than the store's. So a process whose leases
// come and go with gaps longer than a TTL starts a new session after each
// gap without asking Redis first, and the old one, empty, is ended by the
// next reclaim.

// sessionID names generation gen of the sessions of process proc.
func sessionID(proc string, gen int) string { return proc + "." + strconv.Itoa(gen) }

// sessionLocked returns the session calls to g sent at now name, starting a
// new one when the current one went a TTL without a confirmed renewal.
// Store.mu is held.
func (s *Store) sessionLocked(g *group, now time.Time) string {
	if !g.renewed.IsZero() && now.Sub(g.renewed) >= s.ttl {
		s.newSessionLocked(g)
	}
	return g.sid
}

// newSessionLocked gives up g's session and starts the next generation:
// the leases held in the old one are forgotten (a heartbeat reports them
// missing). Store.mu is held.
func (s *Store) newSessionLocked(g *group) {
	old := g.sid
	for id, h := range s.leases {
		if h.g == g && h.sid == old {
			delete(s.leases, id)
		}
	}
	g.gen++
	g.sid = sessionID(s.proc, g.gen)
	g.renewed, g.keysRenewed = time.Time{}, time.Time{}
}

// sessionGone handles Redis's report that session sid of g is dead: unless
// that is already known, the next generation starts.
func (s *Store) sessionGone(g *group, sid string) {
	s.mu.Lock()
	if g.sid == sid {
		s.newSessionLocked(g)
	}
	s.mu.Unlock()
}

// confirmLocked records that Redis keeps session sid of g alive for at
// least a TTL from at (on the store's clock, and no later than the moment
// Redis acted). Store.mu is held.
func (s *Store) confirmLocked(g *group, sid string, at time.Time) {
	if g.sid == sid && at.After(g.renewed) {
		g.renewed = at
	}
}
