package idempotent_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/effectively-once/payments-cashback/internal/testenv"
	"github.com/effectively-once/payments-cashback/pkg/events"
	"github.com/effectively-once/payments-cashback/pkg/idempotent"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// setup returns a pool on a fresh database with the library schema and a
// toy effect table: credits(event_id uuid, amount).
func setup(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool := testenv.DB(t)
	ctx := context.Background()
	if err := idempotent.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE credits (event_id uuid NOT NULL, amount bigint NOT NULL);
		CREATE TABLE wallet (id int PRIMARY KEY, balance bigint NOT NULL); INSERT INTO wallet VALUES (1, 0);`); err != nil {
		t.Fatal(err)
	}
	return pool
}

func newEvent(t *testing.T, amount int64) events.Envelope {
	t.Helper()
	e, err := events.New("PaymentSucceeded", "pay_42", 1, map[string]int64{"amount_paise": amount})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func credit(e events.Envelope, amount int64) idempotent.Effect {
	return func(ctx context.Context, tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO credits VALUES ($1, $2)`, e.EventID, amount); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `UPDATE wallet SET balance = balance + $1 WHERE id = 1`, amount)
		return err
	}
}

func count(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) int64 {
	t.Helper()
	var n int64
	if err := pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func newConsumer(t *testing.T, pool *pgxpool.Pool, opts ...idempotent.Option) *idempotent.Consumer {
	t.Helper()
	c, err := idempotent.NewConsumer(pool, "rewards", opts...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestDuplicateInsertsNothingAndAppliesNothing(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	c := newConsumer(t, pool)
	ctx := context.Background()
	e := newEvent(t, 2400)
	out, err := c.Handle(ctx, idempotent.MessageOf(e), credit(e, 2400))
	if err != nil || out != idempotent.Applied {
		t.Fatalf("first delivery: %v %v, want applied", out, err)
	}
	for range 3 {
		ran := false
		out, err = c.Handle(ctx, idempotent.MessageOf(e), func(ctx context.Context, tx pgx.Tx) error { ran = true; return nil })
		if err != nil || out != idempotent.Duplicate || ran {
			t.Fatalf("redelivery: %v %v ran=%v, want duplicate without running", out, err, ran)
		}
	}
	if n := count(t, pool, `SELECT count(*) FROM processed_messages`); n != 1 {
		t.Fatalf("processed_messages rows = %d, want 1", n)
	}
	if n := count(t, pool, `SELECT count(*) FROM credits`); n != 1 {
		t.Fatalf("credits = %d, want 1", n)
	}
	if b := count(t, pool, `SELECT balance FROM wallet`); b != 2400 {
		t.Fatalf("balance = %d, want 2400", b)
	}
}

func TestKeysAreScopedPerConsumer(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	e := newEvent(t, 100)
	a, _ := idempotent.NewConsumer(pool, "rewards")
	b, _ := idempotent.NewConsumer(pool, "analytics")
	for _, c := range []*idempotent.Consumer{a, b} {
		if out, err := c.Handle(ctx, idempotent.MessageOf(e), credit(e, 100)); out != idempotent.Applied {
			t.Fatalf("%s: %v %v, want applied", c.Name(), out, err)
		}
	}
	if n := count(t, pool, `SELECT count(*) FROM credits`); n != 2 {
		t.Fatalf("credits = %d, want one per consumer (2)", n)
	}
}

func TestConcurrentDeliveriesApplyOnce(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	c := newConsumer(t, pool)
	ctx := context.Background()
	e := newEvent(t, 2400)
	entered := make(chan struct{})
	release := make(chan struct{})
	var wg sync.WaitGroup
	var first, second idempotent.Outcome
	wg.Add(2)
	go func() {
		defer wg.Done()
		first, _ = c.Handle(ctx, idempotent.MessageOf(e), func(ctx context.Context, tx pgx.Tx) error {
			close(entered)
			<-release // hold the key uncommitted while the second delivery arrives
			return credit(e, 2400)(ctx, tx)
		})
	}()
	<-entered
	secondRan := false
	go func() {
		defer wg.Done()
		second, _ = c.Handle(ctx, idempotent.MessageOf(e), func(ctx context.Context, tx pgx.Tx) error {
			secondRan = true
			return credit(e, 2400)(ctx, tx)
		})
	}()
	// The second INSERT must be waiting on the first's key, not done.
	time.Sleep(200 * time.Millisecond)
	if n := count(t, pool, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()`); n != 1 {
		t.Fatalf("sessions waiting on a lock = %d, want 1 (the second delivery)", n)
	}
	close(release)
	wg.Wait()
	if first != idempotent.Applied || second != idempotent.Duplicate || secondRan {
		t.Fatalf("outcomes %v, %v (second ran: %v), want applied, duplicate", first, second, secondRan)
	}
	if n := count(t, pool, `SELECT count(*) FROM credits`); n != 1 {
		t.Fatalf("credits = %d, want 1", n)
	}
}

func TestManyConcurrentCopies(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	c := newConsumer(t, pool)
	ctx := context.Background()
	e := newEvent(t, 2400)
	var wg sync.WaitGroup
	outs := make([]idempotent.Outcome, 16)
	for i := range outs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			outs[i], _ = c.Handle(ctx, idempotent.MessageOf(e), credit(e, 2400))
		}()
	}
	wg.Wait()
	applied := 0
	for _, o := range outs {
		if o == idempotent.Applied {
			applied++
		} else if o != idempotent.Duplicate {
			t.Fatalf("outcome %v", o)
		}
	}
	if applied != 1 || count(t, pool, `SELECT balance FROM wallet`) != 2400 {
		t.Fatalf("applied %d times, balance %d; want once, 2400", applied, count(t, pool, `SELECT balance FROM wallet`))
	}
}

func TestHandlerErrorLeavesNoKeyAndRedeliveryApplies(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	c := newConsumer(t, pool)
	ctx := context.Background()
	e := newEvent(t, 2400)
	boom := errors.New("provider down")
	out, err := c.Handle(ctx, idempotent.MessageOf(e), func(ctx context.Context, tx pgx.Tx) error {
		if err := credit(e, 2400)(ctx, tx); err != nil {
			return err
		}
		return boom // after the effect's writes: they must roll back too
	})
	if out != idempotent.Failed || !errors.Is(err, boom) || out.Done() {
		t.Fatalf("failing handler: %v %v, want failed/boom", out, err)
	}
	if n := count(t, pool, `SELECT count(*) FROM processed_messages`); n != 0 {
		t.Fatalf("dedupe rows after failure = %d, want 0", n)
	}
	if n := count(t, pool, `SELECT count(*) FROM credits`); n != 0 {
		t.Fatalf("credits after failure = %d, want 0", n)
	}
	out, err = c.Handle(ctx, idempotent.MessageOf(e), credit(e, 2400))
	if out != idempotent.Applied || err != nil {
		t.Fatalf("redelivery: %v %v, want applied", out, err)
	}
	if b := count(t, pool, `SELECT balance FROM wallet`); b != 2400 {
		t.Fatalf("balance = %d, want 2400", b)
	}
}

func TestSameIDDifferentPayloadIsAConflict(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	c := newConsumer(t, pool)
	ctx := context.Background()
	e := newEvent(t, 2400)
	if out, _ := c.Handle(ctx, idempotent.MessageOf(e), credit(e, 2400)); out != idempotent.Applied {
		t.Fatal("first not applied")
	}
	forged := e
	forged.Payload = []byte(`{"amount_paise":360000}`)
	out, err := c.Handle(ctx, idempotent.MessageOf(forged), credit(forged, 7200))
	if out != idempotent.Conflict || !errors.Is(err, idempotent.ErrConflict) || out.Done() {
		t.Fatalf("forged copy: %v %v, want conflict", out, err)
	}
	var p interface{ Permanent() bool }
	if !errors.As(err, &p) || !p.Permanent() {
		t.Fatal("ErrConflict is not marked permanent")
	}
	if b := count(t, pool, `SELECT balance FROM wallet`); b != 2400 {
		t.Fatalf("balance = %d, want 2400", b)
	}
}

func TestSerializationFailureIsRetried(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	c := newConsumer(t, pool)
	ctx := context.Background()
	e := newEvent(t, 2400)
	attempts := 0
	out, err := c.Handle(ctx, idempotent.MessageOf(e), func(ctx context.Context, tx pgx.Tx) error {
		attempts++
		if attempts < 3 {
			// What a real 40001 looks like to the caller.
			_, err := tx.Exec(ctx, `DO $$ BEGIN RAISE EXCEPTION 'conflict' USING ERRCODE = '40001'; END $$`)
			return err
		}
		return credit(e, 2400)(ctx, tx)
	})
	if out != idempotent.Applied || err != nil || attempts != 3 {
		t.Fatalf("got %v %v after %d attempts, want applied after 3", out, err, attempts)
	}
	if n := count(t, pool, `SELECT count(*) FROM credits`); n != 1 {
		t.Fatalf("credits = %d, want 1", n)
	}
}

func TestExpiredCopyIsRefused(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	c := newConsumer(t, pool)
	ctx := context.Background()
	e := newEvent(t, 2400)
	e.OccurredAt = time.Now().Add(-idempotent.DefaultRetention - time.Hour)
	out, err := c.Handle(ctx, idempotent.MessageOf(e), credit(e, 2400))
	if out != idempotent.Expired || !errors.Is(err, idempotent.ErrExpired) {
		t.Fatalf("old copy: %v %v, want expired", out, err)
	}
	if n := count(t, pool, `SELECT count(*) FROM credits`) + count(t, pool, `SELECT count(*) FROM processed_messages`); n != 0 {
		t.Fatalf("rows written for a refused copy: %d", n)
	}
}

func TestBatchAppliesNewSkipsDuplicatesAndSplitsOnFailure(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	c := newConsumer(t, pool)
	ctx := context.Background()
	evs := make([]events.Envelope, 10)
	for i := range evs {
		evs[i] = newEvent(t, 100)
	}
	// Two already processed, one copy twice in the same batch, one poison.
	for _, e := range evs[:2] {
		if out, _ := c.Handle(ctx, idempotent.MessageOf(e), credit(e, 100)); out != idempotent.Applied {
			t.Fatal("setup not applied")
		}
	}
	boom := errors.New("poison")
	var items []idempotent.Item
	for i, e := range evs {
		eff := credit(e, 100)
		if i == 7 {
			eff = func(context.Context, pgx.Tx) error { return boom }
		}
		items = append(items, idempotent.Item{Msg: idempotent.MessageOf(e), Effect: eff})
	}
	items = append(items, idempotent.Item{Msg: idempotent.MessageOf(evs[5]), Effect: credit(evs[5], 100)})
	outs, errs := c.HandleBatch(ctx, items)
	for i := range outs {
		w := idempotent.Applied
		switch {
		case i < 2 || i == 10:
			w = idempotent.Duplicate
		case i == 7:
			w = idempotent.Failed
		}
		if outs[i] != w {
			t.Fatalf("item %d: %v (%v), want %v", i, outs[i], errs[i], w)
		}
	}
	if !errors.Is(errs[7], boom) {
		t.Fatalf("poison error = %v", errs[7])
	}
	// 2 before + 7 in the batch (10 - 2 dup - 1 poison); the in-batch copy adds nothing.
	if n := count(t, pool, `SELECT count(*) FROM credits`); n != 9 {
		t.Fatalf("credits = %d, want 9", n)
	}
	if n := count(t, pool, `SELECT count(*) FROM processed_messages`); n != 9 {
		t.Fatalf("keys = %d, want 9 (no key for the poison message)", n)
	}
}

func TestBatchWithoutFailuresIsOneTransaction(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	c := newConsumer(t, pool)
	ctx := context.Background()
	var items []idempotent.Item
	for range 10 {
		e := newEvent(t, 100)
		items = append(items, idempotent.Item{Msg: idempotent.MessageOf(e), Effect: credit(e, 100)})
	}
	outs, _ := c.HandleBatch(ctx, items)
	for i, o := range outs {
		if o != idempotent.Applied {
			t.Fatalf("item %d: %v", i, o)
		}
	}
	if n := count(t, pool, `SELECT count(DISTINCT xmin::text) FROM credits`); n != 1 {
		t.Fatalf("credits written by %d transactions, want 1", n)
	}
}

// idAt is a UUIDv7 minted at t, as a producer whose clock reads t mints it.
func idAt(t time.Time) uuid.UUID {
	id := uuid.Must(uuid.NewV7())
	ms := uint64(t.UnixMilli())
	for i := range 6 {
		id[i] = byte(ms >> (40 - 8*i))
	}
	return id
}

// An event id minted more than MaxFutureSkew ahead of the consumer's clock
// (a producer whose clock runs days ahead) is refused at once, permanently,
// with a reason that names the skew, and nothing is written; it is not a
// transient error that loops until the queue's redrive drops it in the DLQ
// with no reason. An id within the skew is applied as usual.
func TestEventIDFarInTheFutureIsRefusedPermanently(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	c := newConsumer(t, pool)
	ctx := context.Background()
	ahead := newEvent(t, 2400)
	ahead.EventID = idAt(time.Now().Add(idempotent.MaxFutureSkew + 24*time.Hour))
	out, err := c.Handle(ctx, idempotent.MessageOf(ahead), credit(ahead, 2400))
	if out != idempotent.Failed || !idempotent.IsPermanent(err) || err == nil || !strings.Contains(err.Error(), "ahead") {
		t.Fatalf("id 4 days ahead: %v %v; want Failed with a permanent error naming the skew", out, err)
	}
	outs, errs := c.HandleBatch(ctx, []idempotent.Item{{Msg: idempotent.MessageOf(ahead), Effect: credit(ahead, 2400)}})
	if outs[0] != idempotent.Failed || !idempotent.IsPermanent(errs[0]) {
		t.Fatalf("HandleBatch, id 4 days ahead: %v %v; want Failed, permanent", outs[0], errs[0])
	}
	if n := count(t, pool, `SELECT count(*) FROM credits`) + count(t, pool, `SELECT count(*) FROM processed_messages`); n != 0 {
		t.Fatalf("rows written for a refused copy: %d", n)
	}
	near := newEvent(t, 100)
	near.EventID = idAt(time.Now().Add(idempotent.MaxFutureSkew - time.Hour))
	if out, err := c.Handle(ctx, idempotent.MessageOf(near), credit(near, 100)); out != idempotent.Applied || err != nil {
		t.Fatalf("id within the skew: %v %v; want applied", out, err)
	}
}
