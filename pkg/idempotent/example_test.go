package idempotent_test

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/effectively-once/payments-cashback/internal/testenv"
	"github.com/effectively-once/payments-cashback/pkg/events"
	"github.com/effectively-once/payments-cashback/pkg/idempotent"
)

// The same event delivered three times is applied once: the dedupe key
// commits in the effect's transaction, and a copy finds it there.
func ExampleConsumer_Handle() {
	tb, done := testenv.Scratch()
	defer done()
	ctx, pool := context.Background(), testenv.DB(tb)
	if err := idempotent.Migrate(ctx, pool); err != nil {
		panic(err)
	}
	_, _ = pool.Exec(ctx, `CREATE TABLE wallets (user_id text PRIMARY KEY, balance_paise bigint NOT NULL)`)
	c, err := idempotent.NewConsumer(pool, "rewards")
	if err != nil {
		panic(err)
	}
	e, _ := events.New("PaymentSucceeded", "pay_42", 1, map[string]any{"user_id": "u_17", "amount_paise": 120000})

	credit := func(ctx context.Context, tx pgx.Tx) error { // touch nothing but tx
		_, err := tx.Exec(ctx, `INSERT INTO wallets VALUES ('u_17', 2400)
			ON CONFLICT (user_id) DO UPDATE SET balance_paise = wallets.balance_paise + 2400`)
		return err
	}
	for range 3 { // a relay resend, a visibility timeout, a redrive
		out, err := c.Handle(ctx, idempotent.MessageOf(e), credit)
		fmt.Println(out, err, "ack:", out.Done())
	}
	var balance int64
	_ = pool.QueryRow(ctx, `SELECT balance_paise FROM wallets WHERE user_id = 'u_17'`).Scan(&balance)
	fmt.Println("balance:", balance)
	// Output:
	// applied <nil> ack: true
	// duplicate <nil> ack: true
	// duplicate <nil> ack: true
	// balance: 2400
}

// A receive's worth of messages in one transaction and one COMMIT; a
// duplicate inside the batch, or of an earlier one, runs nothing.
func ExampleConsumer_HandleBatch() {
	tb, done := testenv.Scratch()
	defer done()
	ctx, pool := context.Background(), testenv.DB(tb)
	if err := idempotent.Migrate(ctx, pool); err != nil {
		panic(err)
	}
	_, _ = pool.Exec(ctx, `CREATE TABLE credits (payment_id text PRIMARY KEY)`)
	c, _ := idempotent.NewConsumer(pool, "rewards")
	item := func(e events.Envelope) idempotent.Item {
		return idempotent.Item{Msg: idempotent.MessageOf(e), Effect: func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO credits VALUES ($1)`, e.AggregateID)
			return err
		}}
	}
	a, _ := events.New("PaymentSucceeded", "pay_1", 1, map[string]any{})
	b, _ := events.New("PaymentSucceeded", "pay_2", 1, map[string]any{})
	outs, errs := c.HandleBatch(ctx, []idempotent.Item{item(a), item(b), item(a)})
	for i := range outs {
		fmt.Println(outs[i], errs[i])
	}
	var n int
	_ = pool.QueryRow(ctx, `SELECT count(*) FROM credits`).Scan(&n)
	fmt.Println("credits:", n)
	// Output:
	// applied <nil>
	// applied <nil>
	// duplicate <nil>
	// credits: 2
}

// The same batch with its new messages applied by one statement: the
// BatchEffect gets the indexes of the fresh items (the duplicate is not
// among them); each Item's own Effect runs only if the batch falls back to
// one message at a time.
func ExampleConsumer_HandleBatchWith() {
	tb, done := testenv.Scratch()
	defer done()
	ctx, pool := context.Background(), testenv.DB(tb)
	if err := idempotent.Migrate(ctx, pool); err != nil {
		panic(err)
	}
	_, _ = pool.Exec(ctx, `CREATE TABLE credits (payment_id text PRIMARY KEY)`)
	c, _ := idempotent.NewConsumer(pool, "rewards")
	var evs []events.Envelope
	for _, pay := range []string{"pay_1", "pay_2", "pay_1"} {
		e, _ := events.New("PaymentSucceeded", pay, 1, map[string]any{})
		evs = append(evs, e)
	}
	evs[2] = evs[0] // a second copy of the first event
	items := make([]idempotent.Item, len(evs))
	for i, e := range evs {
		items[i] = idempotent.Item{Msg: idempotent.MessageOf(e), Effect: func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO credits VALUES ($1)`, e.AggregateID)
			return err
		}}
	}
	outs, _ := c.HandleBatchWith(ctx, items, func(ctx context.Context, tx pgx.Tx, fresh []int) error {
		fmt.Println("fresh:", fresh)
		pays := make([]string, len(fresh))
		for k, i := range fresh {
			pays[k] = evs[i].AggregateID
		}
		_, err := tx.Exec(ctx, `INSERT INTO credits SELECT unnest($1::text[])`, pays)
		return err
	})
	fmt.Println(outs)
	var n int
	_ = pool.QueryRow(ctx, `SELECT count(*) FROM credits`).Scan(&n)
	fmt.Println("credits:", n)
	// Output:
	// fresh: [0 1]
	// [applied applied duplicate]
	// credits: 2
}

// The inbox stores a message and lets the transport ack it at once; a
// processor applies stored rows later, in order per key, with retries and
// back-off in the database. A copy is not stored twice.
func ExampleInbox_NewProcessor() {
	tb, done := testenv.Scratch()
	defer done()
	ctx, pool := context.Background(), testenv.DB(tb)
	if err := idempotent.Migrate(ctx, pool); err != nil {
		panic(err)
	}
	inbox, err := idempotent.NewInbox(pool, "notifications", idempotent.InboxConfig{})
	if err != nil {
		panic(err)
	}
	defer inbox.Close()
	e, _ := events.New("CashbackCredited", "pay_42", 1, map[string]any{"user_id": "u_17", "amount_paise": 2400})
	for range 2 {
		stored, err := inbox.Receive(ctx, e, idempotent.ByAggregate(e))
		fmt.Println("stored:", stored, err)
	}

	applied := make(chan string, 1)
	proc, err := inbox.NewProcessor(func(ctx context.Context, tx pgx.Tx, e events.Envelope) error {
		applied <- e.EventType + " " + e.AggregateID // a real effect writes through tx
		return nil
	}, idempotent.ProcessorConfig{PollInterval: 50 * time.Millisecond})
	if err != nil {
		panic(err)
	}
	ctx, stop := context.WithCancel(ctx)
	stopped := make(chan error, 1)
	go func() { stopped <- proc.Run(ctx) }()
	fmt.Println("applied:", <-applied)
	stop()
	fmt.Println("processor stopped:", <-stopped)
	// Output:
	// stored: true <nil>
	// stored: false <nil>
	// applied: CashbackCredited pay_42
	// processor stopped: <nil>
}
