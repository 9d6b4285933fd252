package main

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"

	"github.com/effectively-once/payments-cashback/internal/benchfeed"
)

// The same effect as cmd/bench's inbox pipeline: a credit row and a wallet
// move, committed with the job's completion (river.JobCompleteTx), which
// is the closest River comes to "applied once": the effect and the job's
// completed state commit together.
const effectSchema = `
CREATE TABLE bench_credits (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, payment_id text NOT NULL UNIQUE, user_id text NOT NULL,
    amount_paise bigint NOT NULL, event_id uuid NOT NULL, credited_at timestamptz NOT NULL DEFAULT now());
CREATE TABLE bench_wallets (user_id text PRIMARY KEY, balance_paise bigint NOT NULL DEFAULT 0, updated_at timestamptz NOT NULL DEFAULT now());
INSERT INTO bench_wallets (user_id) SELECT 'u_' || g FROM generate_series(0, 9999) g;
ANALYZE;`

type creditArgs struct {
	EventID   uuid.UUID `json:"event_id"`
	PaymentID string    `json:"payment_id"`
	UserID    string    `json:"user_id"`
	Amount    int64     `json:"amount_paise"`
}

func (creditArgs) Kind() string { return "credit" }

type creditWorker struct {
	river.WorkerDefaults[creditArgs]
	pool *pgxpool.Pool
	done func(id uuid.UUID)
}

func (w *creditWorker) Work(ctx context.Context, job *river.Job[creditArgs]) (err error) {
	a := job.Args
	// Stamped once the effect is committed, as the inbox's side is.
	defer func() {
		if err == nil {
			w.done(a.EventID)
		}
	}()
	return pgx.BeginFunc(ctx, w.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO bench_credits (payment_id, user_id, amount_paise, event_id) VALUES ($1, $2, $3, $4)`,
			a.PaymentID, a.UserID, a.Amount, a.EventID); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `UPDATE bench_wallets SET balance_paise = balance_paise + $2, updated_at = now() WHERE user_id = $1`,
			a.UserID, a.Amount); err != nil {
			return err
		}
		_, err := river.JobCompleteTx[*riverpgxv5.Driver](ctx, tx, job)
		return err
	})
}

// Tuning, as River's docs advise for throughput: enough workers to keep
// the database busy, a short FetchCooldown (the floor between fetches;
// "throughput is limited by this value", default 100 ms) and a short poll
// as the fallback to its LISTEN/NOTIFY wake-up. Workers are 50, not
// River's default 100: each busy worker holds a connection, and 100 of
// them with the inserters' and River's own would pass a stock server's
// max_connections of 100 (it did, once River fell behind the offered rate
// and every worker was busy). 50 keep two cores' worth of database busy.
const (
	riverWorkers       = 50
	riverFetchCooldown = 5 * time.Millisecond
	riverFetchPoll     = 50 * time.Millisecond
	inserters          = 8
)

// riverRound inserts n jobs, 8 at once, and waits until every one was
// worked. rate 0 inserts them as fast as the inserters go (throughput);
// rate > 0 offers them at that many per second (latency at a load both
// sides carry).
func riverRound(ctx context.Context, run string, n int, rate float64) (result, error) {
	pool, drop, err := freshDB(ctx, run, "river", riverWorkers+inserters+4)
	if err != nil {
		return result{}, err
	}
	defer drop()
	driver := riverpgxv5.New(pool)
	mig, err := rivermigrate.New(driver, nil)
	if err != nil {
		return result{}, err
	}
	if _, err := mig.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return result{}, err
	}
	if _, err := pool.Exec(ctx, effectSchema); err != nil {
		return result{}, err
	}
	var mu sync.Mutex
	committed := make(map[uuid.UUID]time.Time, n)
	applied := make(map[uuid.UUID]time.Time, n)
	var nApplied atomic.Int64
	workers := river.NewWorkers()
	river.AddWorker(workers, &creditWorker{pool: pool, done: func(id uuid.UUID) {
		now := time.Now()
		mu.Lock()
		applied[id] = now
		mu.Unlock()
		nApplied.Add(1)
	}})
	client, err := river.NewClient(driver, &river.Config{
		Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: riverWorkers}},
		Workers:           workers,
		FetchCooldown:     riverFetchCooldown,
		FetchPollInterval: riverFetchPoll,
		Logger:            slog.New(slog.DiscardHandler),
	})
	if err != nil {
		return result{}, err
	}
	if err := client.Start(ctx); err != nil {
		return result{}, err
	}
	defer func() {
		c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = client.Stop(c)
	}()
	args := make([]creditArgs, n)
	for i := range args {
		args[i] = creditArgs{EventID: uuid.Must(uuid.NewV7()), PaymentID: "pay_" + uuid.NewString()[:18],
			UserID: fmt.Sprintf("u_%d", rand.IntN(10000)), Amount: 2400}
	}
	start := time.Now()
	// InsertTx in the receiving transaction: the job commits with whatever
	// the receiver writes.
	if err := benchfeed.Feed(ctx, n, rate, inserters, func(i int) error {
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := client.InsertTx(ctx, tx, args[i], nil)
			return err
		}); err != nil {
			return err
		}
		now := time.Now()
		mu.Lock()
		committed[args[i].EventID] = now
		mu.Unlock()
		return nil
	}); err != nil {
		return result{}, err
	}
	for nApplied.Load() < int64(n) {
		select {
		case <-ctx.Done():
			return result{}, fmt.Errorf("river: %d of %d jobs worked: %w", nApplied.Load(), n, ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
	el := time.Since(start)
	mu.Lock()
	var lat []time.Duration
	for id, c := range committed {
		if a, ok := applied[id]; ok {
			lat = append(lat, a.Sub(c))
		}
	}
	mu.Unlock()
	return result{Case: "river", Count: n, Offered: rate, Seconds: el.Seconds(), Rate: float64(n) / el.Seconds(),
		P50ms: percentile(lat, 0.5), P99ms: percentile(lat, 0.99), Config: map[string]any{
			"river": "v0.51.2", "driver": "riverpgxv5", "max_workers": riverWorkers, "fetch_cooldown": riverFetchCooldown.String(),
			"fetch_poll_interval": riverFetchPoll.String(), "inserters": inserters, "offered_rate": rate, "completion": "JobCompleteTx in the effect's transaction"}}, nil
}
