package redisstore_test

import (
	"context"
	"testing"

	"github.com/runbudget/runbudget/internal/redistest"
)

// The two wake mechanisms the store could use, bare, on one Redis: what
// the package doc's choice of pub/sub rests on.

func BenchmarkWakeFloorPubSub(b *testing.B) {
	srv := redistest.Start(b)
	pub, subc := srv.Client(b), srv.Client(b)
	ctx := context.Background()
	sub := subc.Subscribe(ctx, "wake")
	defer sub.Close()
	if _, err := sub.Receive(ctx); err != nil {
		b.Fatal(err)
	}
	msgs := sub.Channel()
	for b.Loop() {
		if err := pub.Publish(ctx, "wake", "w").Err(); err != nil {
			b.Fatal(err)
		}
		<-msgs
	}
}

func BenchmarkWakeFloorBLPOP(b *testing.B) {
	srv := redistest.Start(b)
	push, pop := srv.Client(b), srv.Client(b)
	ctx := context.Background()
	got := make(chan struct{})
	ready := make(chan struct{})
	go func() {
		for range ready {
			if err := pop.BLPop(ctx, 0, "wake").Err(); err != nil {
				b.Error(err)
			}
			got <- struct{}{}
		}
	}()
	for b.Loop() {
		ready <- struct{}{}
		if err := push.LPush(ctx, "wake", "w").Err(); err != nil {
			b.Fatal(err)
		}
		<-got
	}
	close(ready)
}
