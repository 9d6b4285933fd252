package worker

import (
	"context"
	"testing"
	"time"
)

// Take waits for one free slot and then takes only what is free at once,
// up to its limit; a cancelled wait takes none.
func TestSlotsTakeOneThenWhatIsFree(t *testing.T) {
	s := NewSlots(4)
	ctx := context.Background()
	if n := s.Take(ctx, 3); n != 3 {
		t.Fatalf("Take(3) of 4 free = %d, want 3", n)
	}
	if n := s.Take(ctx, 3); n != 1 {
		t.Fatalf("Take(3) with 1 free = %d, want 1 (what is free, without waiting for more)", n)
	}
	took := make(chan int, 1)
	go func() { took <- s.Take(ctx, 3) }()
	select {
	case n := <-took:
		t.Fatalf("Take with none free returned %d, want it to wait", n)
	case <-time.After(20 * time.Millisecond):
	}
	s.Release(2)
	if n := <-took; n < 1 || n > 2 {
		t.Fatalf("Take after 2 released = %d, want 1 or 2", n)
	}
	full := NewSlots(1)
	full.Take(ctx, 1)
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if n := full.Take(cctx, 3); n != 0 {
		t.Fatalf("Take on a cancelled context with none free = %d, want 0", n)
	}
}
