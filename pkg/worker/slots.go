package worker

import "context"

// Slots bounds the work a loop has in flight when it starts work without
// waiting for it: a receive loop's handlers, the SMS sender's calls. Each
// unit of work holds one slot until it is released. Safe for concurrent
// use.
type Slots struct{ ch chan struct{} }

// NewSlots returns n free slots.
func NewSlots(n int) *Slots { return &Slots{ch: make(chan struct{}, n)} }

// Take waits for one free slot, then takes every other one that is free at
// once, up to most in all, and returns how many it took: 0 only when ctx
// ended first. Work is fetched for the slots taken, so none waits in
// memory for a slot.
func (s *Slots) Take(ctx context.Context, most int) int {
	select {
	case s.ch <- struct{}{}:
	case <-ctx.Done():
		return 0
	}
	n := 1
	for n < most {
		select {
		case s.ch <- struct{}{}:
			n++
		default:
			return n
		}
	}
	return n
}

// Release frees n slots taken by Take.
func (s *Slots) Release(n int) {
	for range n {
		<-s.ch
	}
}
