package sqstransport_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/effectively-once/payments-cashback/internal/testenv"
	"github.com/effectively-once/payments-cashback/pkg/errs"
	"github.com/effectively-once/payments-cashback/pkg/sqstransport"
)

// A panic that a library below the handler recovered (idempotent.Consumer
// recovers a panicking Effect and returns a *errs.PanicError) is counted as
// the handler's panic: on the MaxPanics-th receive the message is parked
// with reason "panic", as if the panic had reached the subscriber, rather
// than redelivered until SQS dead-letters it without a reason.
func TestARecoveredPanicReturnedAsAnErrorCountsTowardsMaxPanics(t *testing.T) {
	t.Parallel()
	c := testenv.SQS(t)
	q, dlq := testenv.Queue(t, c, 5, 30*time.Second)
	bad, good := newEvent(t, 1), newEvent(t, 2)
	rec := &recorder{then: func(d sqstransport.Delivery, _ int) error {
		if d.Envelope.EventID == bad.EventID {
			return fmt.Errorf("idempotent: effect panicked: %w", &errs.PanicError{Value: "nil map in the cashback rule"})
		}
		return nil
	}}
	cfg := testConfig(q)
	cfg.MaxPanics = 1
	start(t, c, cfg, rec.handle)
	send(t, c, q, bad)
	send(t, c, q, good)

	body, _ := bad.Marshal()
	reasons := dlqReasons(t, c, dlq, 1, 10*time.Second)
	if r, ok := reasons[string(body)]; !ok || !strings.HasPrefix(r, "panic: ") || !strings.Contains(r, "nil map in the cashback rule") {
		t.Fatalf("DLQ park reasons %v; want the message whose effect panicked, with reason \"panic: ...\"", reasons)
	}
	waitEmpty(t, c, q, 5*time.Second)
	if n := counter(t, "sqs_messages_parked_total", queueName(q), "panic"); n != 1 {
		t.Errorf("sqs_messages_parked_total{reason=panic} = %d, want 1", n)
	}
}

// A batch handler that panics fails only the message that panics: the
// subscriber hands the receive's deliveries to it again one at a time, each
// recovered, so the innocent neighbour is applied and deleted and only the
// panicking one counts towards MaxPanics and is parked with reason "panic".
// Before, the one panic failed every message of the receive, and on the
// MaxPanics-th receive the neighbour was parked too, never applied.
// (MaxPanics 1 parks whatever panics at once, so one receive shows it.)
func TestABatchPanicFailsOnlyTheMessageThatPanics(t *testing.T) {
	t.Parallel()
	c := testenv.SQS(t)
	q, dlq := testenv.Queue(t, c, 5, 30*time.Second)
	innocent, poison := newEvent(t, 1), newEvent(t, 2)
	sendTogether(t, c, q, innocent, poison)
	var mu sync.Mutex
	applied := map[string]int{}
	together := false // a call held both messages
	h := func(ctx context.Context, ds []sqstransport.Delivery) []error {
		mu.Lock()
		together = together || len(ds) == 2
		mu.Unlock()
		for _, d := range ds {
			if d.Envelope.EventID == poison.EventID {
				panic("effect of the poison message panicked")
			}
		}
		mu.Lock()
		for _, d := range ds {
			applied[d.Envelope.EventID.String()]++
		}
		mu.Unlock()
		return make([]error, len(ds))
	}
	cfg := testConfig(q)
	cfg.MaxPanics = 1
	s, err := sqstransport.NewBatchSubscriber(c, cfg, h)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	waitEmpty(t, c, q, 30*time.Second)
	reasons := dlqReasons(t, c, dlq, 2, 3*time.Second)
	mu.Lock()
	defer mu.Unlock()
	if !together {
		t.Skip("SQS delivered the two messages in separate receives: nothing to show")
	}
	ib, _ := innocent.Marshal() // the DLQ's reasons are keyed by body
	pb, _ := poison.Marshal()
	if r, ok := reasons[string(ib)]; ok || applied[innocent.EventID.String()] != 1 {
		t.Fatalf("innocent message applied %d times (want 1) and parked: %v (reason %q)",
			applied[innocent.EventID.String()], ok, r)
	}
	if r := reasons[string(pb)]; len(reasons) != 1 || !strings.HasPrefix(r, "panic: ") {
		t.Fatalf("DLQ reasons %v; want only the poison message, with reason \"panic: ...\"", reasons)
	}
}
