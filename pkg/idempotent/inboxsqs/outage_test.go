package inboxsqs_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/effectively-once/payments-cashback/internal/faults"
	"github.com/effectively-once/payments-cashback/internal/testenv"
	"github.com/effectively-once/payments-cashback/pkg/events"
	"github.com/effectively-once/payments-cashback/pkg/idempotent"
	"github.com/effectively-once/payments-cashback/pkg/idempotent/inboxsqs"
	"github.com/effectively-once/payments-cashback/pkg/outage"
	"github.com/effectively-once/payments-cashback/pkg/sqstransport"
)

// The inbox receiver behind an outage gate: while its database is away it
// stores nothing and receives nothing, so a cut several times longer than
// the dead-letter schedule (0.1+0.2+0.4+0.4 s to the 5th receive) parks no
// message, and every one is stored, once, after the database returns.
func TestTheInboxReceiverWaitsOutADatabaseOutageWithoutDeadLettering(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	direct := testenv.DB(t)
	if err := idempotent.Migrate(ctx, direct); err != nil {
		t.Fatal(err)
	}
	fx := faults.New()
	t.Cleanup(fx.Close)
	via, px, err := fx.Postgres(ctx, "inbox-db", direct)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(via.Close)
	in, err := idempotent.NewInbox(via, "notifications", idempotent.InboxConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = in.Close() })
	g, err := outage.NewGate(outage.GateConfig{Name: "database", Probe: via.Ping, ProbeBase: 50 * time.Millisecond, ProbeMax: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	c := testenv.SQS(t)
	q, dlq := testenv.Queue(t, c, 5, 2*time.Second)
	sub, err := sqstransport.NewSubscriber(c, sqstransport.SubscriberConfig{QueueURL: q, DLQURL: dlq, WaitTime: time.Second,
		Visibility: 2 * time.Second, RetryBase: 100 * time.Millisecond, RetryMax: 400 * time.Millisecond, ShutdownGrace: 5 * time.Second, Gate: g},
		inboxsqs.Handler(in, idempotent.ByAggregate))
	if err != nil {
		t.Fatal(err)
	}
	subCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { _ = sub.Run(subCtx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })

	px.Cut()
	s := &stack{sqs: c, queue: q}
	evs := make([]events.Envelope, 20)
	for i := range evs {
		evs[i] = event(t, fmt.Sprintf("cb_%d", i), 1)
	}
	s.send(t, evs...)
	waitFor(t, 10*time.Second, "the gate to close", g.Closed)
	time.Sleep(4 * time.Second)
	if n := depth(t, c, dlq); n != 0 {
		t.Fatalf("%d messages dead-lettered during the outage; want 0", n)
	}
	if err := px.Restore(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "every message stored and acked", func() bool { return depth(t, c, q) == 0 })
	if n := count(t, direct, `SELECT count(*) FROM inbox`); n != 20 {
		t.Fatalf("inbox holds %d rows, want 20", n)
	}
	if n := depth(t, c, dlq); n != 0 {
		t.Fatalf("%d messages dead-lettered; want 0", n)
	}
}
