package outbox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/effectively-once/payments-cashback/internal/testenv"
	"github.com/effectively-once/payments-cashback/pkg/events"
	"github.com/effectively-once/payments-cashback/pkg/outbox"
)

// The event commits with the state change, or not at all: a rolled-back
// transaction leaves no outbox row.
func ExampleAdd() {
	tb, done := testenv.Scratch()
	defer done()
	ctx, pool := context.Background(), testenv.DB(tb)
	if err := outbox.Migrate(ctx, pool); err != nil {
		panic(err)
	}
	_, _ = pool.Exec(ctx, `CREATE TABLE payments (id text PRIMARY KEY, status text NOT NULL)`)

	pay := func(id string, commit bool) error {
		tx, err := pool.Begin(ctx)
		if err != nil {
			return err
		}
		defer tx.Rollback(ctx) // no-op after Commit
		if _, err := tx.Exec(ctx, `INSERT INTO payments (id, status) VALUES ($1, 'SUCCEEDED')`, id); err != nil {
			return err
		}
		e, err := events.New("PaymentSucceeded", id, 1, map[string]any{"payment_id": id, "amount_paise": 120000})
		if err != nil {
			return err
		}
		if err := outbox.Add(ctx, tx, e); err != nil {
			return err
		}
		if !commit {
			return nil // the deferred Rollback drops the payment and its event together
		}
		return tx.Commit(ctx)
	}
	if err := pay("pay_42", true); err != nil {
		panic(err)
	}
	if err := pay("pay_43", false); err != nil {
		panic(err)
	}

	rows, _ := pool.Query(ctx, `SELECT aggregate_id FROM outbox ORDER BY created_at`)
	ids, _ := pgx.CollectRows(rows, pgx.RowTo[string])
	fmt.Println("outbox rows:", ids)
	// Output:
	// outbox rows: [pay_42]
}

// printer is a Publisher that prints what it is given, in place of SQS
// (pkg/sqstransport.Publisher is the real one).
type printer struct {
	mu   sync.Mutex
	sent chan struct{}
}

func (p *printer) PublishBatch(_ context.Context, msgs []outbox.Message) (map[uuid.UUID]error, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, m := range msgs {
		var e events.Envelope
		_ = json.Unmarshal(m.Body, &e)
		fmt.Println("published", m.Attributes["event_type"], e.AggregateID, "event_id attribute matches:", m.Attributes["event_id"] == m.EventID.String())
		p.sent <- struct{}{}
	}
	return nil, nil // every message accepted
}

// A relay publishes committed rows at least once and marks them published.
// Run until cancelled; NOTIFY from Add wakes it, polling is the fallback.
func ExampleRelay_Run() {
	tb, done := testenv.Scratch()
	defer done()
	ctx, pool := context.Background(), testenv.DB(tb)
	if err := outbox.Migrate(ctx, pool); err != nil {
		panic(err)
	}
	pub := &printer{sent: make(chan struct{}, 10)}
	relay, err := outbox.NewRelay(pool, pub, outbox.RelayConfig{})
	if err != nil {
		panic(err)
	}
	ctx, stop := context.WithCancel(ctx)
	stopped := make(chan error, 1)
	go func() { stopped <- relay.Run(ctx) }()

	e, _ := events.New("PaymentSucceeded", "pay_42", 1, map[string]any{"payment_id": "pay_42"})
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return outbox.Add(ctx, tx, e) }); err != nil {
		panic(err)
	}
	<-pub.sent
	for {
		n, _ := relay.Unpublished(ctx) // marked right after the publisher accepted it
		if n == 0 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	stop()
	fmt.Println("relay stopped:", <-stopped)
	// Output:
	// published PaymentSucceeded pay_42 event_id attribute matches: true
	// relay stopped: <nil>
}
