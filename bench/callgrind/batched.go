package main

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/runbudget/runbudget/luascripts"
	"github.com/runbudget/runbudget/redisstore"
)

// The workloads above send one operation per call, but under contention
// group commit sends a lane's release and its next acquire together, as
// one call of the batch function, and the call's fixed cost (the FCALL,
// the time, the limits) is paid once for both. todayBatched counts today's
// scripts sent that way, so that a batched count of a yardstick
// (lean3Batched) has today's to be read against.

// fcallCapture keeps, while on, the arguments of the last FCALL of each
// script the store sends (by the script's name, the function name's
// suffix).
type fcallCapture struct {
	on   atomic.Bool
	last map[string][]any
}

func (h *fcallCapture) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *fcallCapture) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (h *fcallCapture) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if a := cmd.Args(); h.on.Load() && len(a) > 2 && strings.EqualFold(fmt.Sprint(a[0]), "fcall") {
			fn := fmt.Sprint(a[1])
			h.last[fn[strings.LastIndex(fn, "_")+1:]] = append([]any(nil), a...)
		}
		return next(ctx, cmd)
	}
}

// todayBatched counts admissions of batchedOp's line (see there).
func todayBatched(ctx context.Context, c *redis.Client, s *redisstore.Store, ahead int, counted func(string, int, func() error) (float64, error)) (float64, error) {
	op, err := batchedOp(ctx, c, s, ahead)
	if err != nil {
		return 0, err
	}
	return counted("today-batched", 200, op)
}

// batchedOp builds a contended line of ahead waiters on s (which must
// use c), captures the calls of one admission, and returns an admission
// sent as one batch, as group commit sends it under P3's load: the
// holder's retire, which hands the slot to the head, then a new waiter's
// acquire, which queues.
func batchedOp(ctx context.Context, c *redis.Client, s *redisstore.Store, ahead int) (func() error, error) {
	return batchedPairs(ctx, c, s, ahead, 1)
}

// batchedPairs is batchedOp with k such pairs in one batch, each retiring
// the lease the pair before it granted (P3's batches carry about 3.6
// operations under load).
func batchedPairs(ctx context.Context, c *redis.Client, s *redisstore.Store, ahead, k int) (func() error, error) {
	l, acq, ret, err := capturedLine(ctx, c, s, ahead)
	if err != nil {
		return nil, err
	}
	if k < 1 || k > ahead {
		return nil, fmt.Errorf("%d pairs in a batch need 1..%d waiters ahead", k, ahead)
	}
	_, _, fns := luascripts.Library()
	racq, rret := acq[4:], ret[4:]
	return func() error {
		args := make([]any, 0, k*(4+len(rret)+len(racq)))
		ids := make([]string, k)
		for i := range k {
			ids[i] = uuid.NewString()
			args = append(args, "retire", len(rret))
			at := len(args)
			args = append(args, rret...)
			args[at+3] = l.holder // ARGV[4]: the lease id
			if i > 0 {
				args[at+3] = l.waiters[i-1]
			}
			args = append(args, "acquire", len(racq))
			at = len(args)
			args = append(args, racq...)
			args[at+3] = ids[i] // ARGV[4]: the waiter id
		}
		r, err := c.FCall(ctx, fns[luascripts.Batch], []string{fmt.Sprint(acq[3])}, args...).Slice()
		if err != nil {
			return err
		}
		if len(r) != 2*k {
			return fmt.Errorf("batch: %v, want %d replies", r, 2*k)
		}
		for i := 0; i < len(r); i += 2 {
			rr, ok1 := r[i].([]any)
			ar, ok2 := r[i+1].([]any)
			if !ok1 || !ok2 || len(rr) == 0 || len(ar) == 0 || rr[0] != "1" || ar[0] != "2" {
				return fmt.Errorf("batch: retire %v, acquire %v; want done and queued", r[i], r[i+1])
			}
		}
		l.holder, l.waiters = l.waiters[k-1], append(l.waiters[k:], ids...)
		return nil
	}, nil
}

// capturedLine builds a contended line of ahead waiters on s (which must
// use c), runs one admission of it and returns the line and the FCALLs
// that admission sent, acquire's and retire's: FCALL, the function, the
// number of keys (1), the config key, then ARGV.
func capturedLine(ctx context.Context, c *redis.Client, s *redisstore.Store, ahead int) (l *line, acq, ret []any, err error) {
	if l, err = contendedLine(ctx, s, 1, ahead); err != nil {
		return nil, nil, nil, err
	}
	h := &fcallCapture{last: map[string][]any{}}
	c.AddHook(h)
	h.on.Store(true)
	err = l.admission()
	h.on.Store(false)
	if err != nil {
		return nil, nil, nil, err
	}
	acq, ret = h.last["acquire"], h.last["retire"]
	if acq == nil || ret == nil {
		return nil, nil, nil, fmt.Errorf("an admission sent no acquire or no retire by FCALL (%d calls seen)", len(h.last))
	}
	if fmt.Sprint(acq[2]) != "1" || fmt.Sprint(ret[2]) != "1" || acq[3] != ret[3] {
		return nil, nil, nil, fmt.Errorf("unexpected keys: acquire %v, retire %v", acq[2:4], ret[2:4])
	}
	return l, acq, ret, nil
}
