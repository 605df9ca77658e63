package lease_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/runbudget/runbudget/lease"
)

// nopStore confirms every renewal and retirement and keeps nothing.
type nopStore struct{}

func (nopStore) Retire(context.Context, string, lease.Parts) error { return nil }
func (nopStore) Heartbeat(_ context.Context, ids []string) ([]string, error) {
	return nil, nil
}

// BenchmarkKeeperTrack: a lease tracked and released while others are
// held, as a budget does on every admission. Tracking must not cost more
// with more leases held.
func BenchmarkKeeperTrack(b *testing.B) {
	for _, held := range []int{1, 100, 1000, 10000} {
		b.Run("held="+strconv.Itoa(held), func(b *testing.B) {
			var st nopStore
			k, err := lease.NewKeeper(st, time.Hour)
			if err != nil {
				b.Fatal(err)
			}
			defer k.Stop()
			for i := range held {
				k.Track(lease.New("h"+strconv.Itoa(i), lease.All, st), time.Now())
			}
			ids := make([]string, 1024)
			for i := range ids {
				ids[i] = "t" + strconv.Itoa(i)
			}
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				l := lease.New(ids[i%len(ids)], lease.All, st)
				k.Track(l, time.Now())
				l.Release()
			}
		})
	}
}
