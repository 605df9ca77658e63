package redisstore

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/runbudget/runbudget/budget"
)

// Wake dispatch: one subscription per process carries the wake events
// scripts publish for its waiters (see the package doc), and one goroutine
// hands each to the waiter it names.

// waiting is what the store knows of one of this process's waiters.
type waiting struct {
	wake     chan struct{} // signalled by wake events
	lastCall time.Time     // when its latest acquire call was sent
	granted  bool          // a script granted it by handoff and said so
}

// grantedPrefix marks a wake event that carries a grant: a script handed
// the waiter a slot (see the package doc), so it need not call to learn it.
const grantedPrefix = "granted "

// subscribe subscribes to this process's wake channel and starts the
// dispatch goroutine, which Close stops. On failure nothing is left
// running, and the error wraps budget.ErrUnavailable.
func (s *Store) subscribe(ctx context.Context) error {
	wakeChannel := s.prefix + "wake:" + s.channel
	if s.pubCmd == "SPUBLISH" {
		s.sub = s.client.SSubscribe(ctx, wakeChannel)
	} else {
		s.sub = s.client.Subscribe(ctx, wakeChannel)
	}
	if _, err := s.sub.Receive(ctx); err != nil {
		s.sub.Close()
		return fmt.Errorf("redisstore: subscribing to wake events: %w: %v", budget.ErrUnavailable, err)
	}
	s.subDone = make(chan struct{})
	go s.dispatch(s.sub.Channel())
	return nil
}

// dispatch delivers wake events to the waiters of this process, until the
// subscription closes.
func (s *Store) dispatch(msgs <-chan *redis.Message) {
	defer close(s.subDone)
	for m := range msgs {
		id, granted := strings.CutPrefix(m.Payload, grantedPrefix)
		s.mu.Lock()
		w := s.wakes[id]
		if w != nil && granted {
			w.granted = true
		}
		s.mu.Unlock()
		if w != nil {
			select {
			case w.wake <- struct{}{}:
			default: // already signalled
			}
		}
	}
}

// unwatch forgets waiter id: wake events for it are dropped from now on.
func (s *Store) unwatch(id string) {
	s.mu.Lock()
	delete(s.wakes, id)
	s.mu.Unlock()
}
