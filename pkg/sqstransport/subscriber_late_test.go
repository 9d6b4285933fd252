package sqstransport_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/effectively-once/payments-cashback/internal/testenv"
	"github.com/effectively-once/payments-cashback/pkg/events"
	"github.com/effectively-once/payments-cashback/pkg/sqstransport"
)

// One hung message does not cost its batch-mates a delivery. The handler
// behaves as idempotent.Consumer.HandleBatch does: the hung effect holds
// the batch's transaction until the deadline, and its mates, left to run
// one at a time on the same spent context, fail at once. The subscriber
// then hands each failed delivery over on its own, with a deadline of its
// own: the mates are applied and deleted on their first receive, and only
// the hung message comes back.
func TestABatchPastItsDeadlineHandsItsMessagesOverOneAtATime(t *testing.T) {
	t.Parallel()
	c := testenv.SQS(t)
	q, _ := testenv.Queue(t, c, 5, 30*time.Second)
	evs := []events.Envelope{newEvent(t, 1), newEvent(t, 2), newEvent(t, 3)}
	hung := evs[1].EventID
	sendTogether(t, c, q, evs...)

	var mu sync.Mutex
	var sizes []int
	appliedAt := map[string]int{} // event id -> receive count it was applied on
	h := func(ctx context.Context, ds []sqstransport.Delivery) []error {
		mu.Lock()
		sizes = append(sizes, len(ds))
		mu.Unlock()
		out := make([]error, len(ds))
		for i, d := range ds {
			if d.Envelope.EventID == hung {
				<-d.Ctx.Done() // holds the batch until the deadline
				<-ctx.Done()
				out[i] = d.Ctx.Err()
			}
		}
		for i, d := range ds {
			if out[i] == nil && ctx.Err() != nil {
				out[i] = ctx.Err() // the fallback on the spent context
			}
			if out[i] == nil {
				mu.Lock()
				appliedAt[d.Envelope.EventID.String()] = d.ReceiveCount
				mu.Unlock()
			}
		}
		return out
	}
	cfg := testConfig(q) // Visibility 5s: a 4s deadline
	cfg.Concurrency = 1
	runBatch(t, c, cfg, h)
	waitFor(t, 20*time.Second, "both healthy messages applied (they come back with the hung one, batch after batch, towards the DLQ)", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(appliedAt) == 2
	})
	mu.Lock()
	defer mu.Unlock()
	t.Logf("receive sizes %v, applied at %v", sizes, appliedAt)
	if sizes[0] != len(evs) {
		t.Skipf("SQS split the three messages over receives (sizes %v): no batch to cut", sizes)
	}
	for _, e := range []events.Envelope{evs[0], evs[2]} {
		if n := appliedAt[e.EventID.String()]; n != 1 {
			t.Errorf("healthy message %s applied on receive %d, want its first: the hung batch-mate cost it a delivery", e.EventID, n)
		}
	}
}

// A batch handler that runs past its deadline and returns fewer results
// than it was handed deliveries (a bug the BatchHandler contract answers:
// the missing ones are transient failures) has each of its messages
// handed over again alone, as any late batch does, and applied on its
// first receive. The short results used to reach the one-at-a-time pass
// as they were, which indexed past their end: a panic in the subscriber's
// goroutine, which nothing recovers, took the whole process down.
func TestALateBatchThatReturnsTooFewResultsHandsItsMessagesOverAloneInsteadOfCrashing(t *testing.T) {
	t.Parallel()
	c := testenv.SQS(t)
	q, _ := testenv.Queue(t, c, 5, 30*time.Second)
	evs := []events.Envelope{newEvent(t, 1), newEvent(t, 2)}
	sendTogether(t, c, q, evs...)

	var mu sync.Mutex
	var sizes []int
	appliedAt := map[string]int{} // event id -> receive count it was applied on
	h := func(ctx context.Context, ds []sqstransport.Delivery) []error {
		mu.Lock()
		sizes = append(sizes, len(ds))
		first := len(sizes) == 1
		mu.Unlock()
		if first && len(ds) > 1 {
			<-ctx.Done()              // hung past HandlerTimeout
			return []error{ctx.Err()} // one result for the whole batch
		}
		mu.Lock()
		defer mu.Unlock()
		for _, d := range ds {
			appliedAt[d.Envelope.EventID.String()] = d.ReceiveCount
		}
		return make([]error, len(ds))
	}
	cfg := testConfig(q)
	cfg.Concurrency, cfg.HandlerTimeout = 1, 500*time.Millisecond
	runBatch(t, c, cfg, h)
	waitFor(t, 15*time.Second, "both messages applied", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(appliedAt) == 2
	})
	waitEmpty(t, c, q, 10*time.Second)
	mu.Lock()
	defer mu.Unlock()
	t.Logf("receive sizes %v, applied at %v", sizes, appliedAt)
	if sizes[0] != len(evs) {
		t.Skipf("SQS split the two messages over receives (sizes %v): no short batch", sizes)
	}
	if want := []int{2, 1, 1}; fmt.Sprint(sizes) != fmt.Sprint(want) {
		t.Errorf("handler calls of sizes %v, want %v: the late batch, then each message alone", sizes, want)
	}
	for _, e := range evs {
		if n := appliedAt[e.EventID.String()]; n != 1 {
			t.Errorf("message %s applied on receive %d, want its first", e.EventID, n)
		}
	}
}
