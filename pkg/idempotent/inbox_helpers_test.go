package idempotent_test

import (
	"context"
	"encoding/json"
	"errors"
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

// inboxSetup is setup plus the table the inbox tests' handlers write:
// applied(ordering_key, version, event_id, seq), where seq records the order
// in which effects were applied.
func inboxSetup(t testing.TB) *pgxpool.Pool {
	t.Helper()
	pool := testenv.DB(t)
	ctx := context.Background()
	if err := idempotent.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE applied (
			ordering_key text NOT NULL, version bigint NOT NULL, event_id uuid NOT NULL UNIQUE, seq bigserial);
		CREATE TABLE balances (key text PRIMARY KEY, total bigint NOT NULL);
		CREATE TABLE credits (event_id uuid NOT NULL, amount bigint NOT NULL);
		CREATE TABLE wallet (id int PRIMARY KEY, balance bigint NOT NULL); INSERT INTO wallet VALUES (1, 0);`); err != nil {
		t.Fatal(err)
	}
	return pool
}

// metrics records what an Inbox measured (see testenv.Metrics).
type metrics = testenv.Metrics

var newMetrics = testenv.NewMetrics

func newInbox(t testing.TB, pool *pgxpool.Pool, consumer string, cfg idempotent.InboxConfig) *idempotent.Inbox {
	t.Helper()
	in, err := idempotent.NewInbox(pool, consumer, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = in.Close() })
	return in
}

func keyedEvent(t testing.TB, key string, version int64) events.Envelope {
	t.Helper()
	e, err := events.New("CashbackCredited", key, version, map[string]any{"key": key, "version": version})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// record is the handlers' usual effect: one applied row per event.
func record(ctx context.Context, tx pgx.Tx, e events.Envelope) error {
	_, err := tx.Exec(ctx, `INSERT INTO applied (ordering_key, version, event_id) VALUES ($1, $2, $3)`,
		e.AggregateID, e.AggregateVersion, e.EventID)
	return err
}

// runProcessors starts n processors (as n replicas would) and returns a stop
// function that cancels them and waits for them to return.
func runProcessors(t testing.TB, pool *pgxpool.Pool, in *idempotent.Inbox, h idempotent.ProcessFunc, cfg idempotent.ProcessorConfig, n int) (stop func()) {
	t.Helper()
	if cfg.Pool == nil {
		cfg.Pool = otherPool(t, pool, 2*n*max(cfg.Workers, 1))
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range n {
		p, err := in.NewProcessor(h, cfg)
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			if err := p.Run(ctx); err != nil {
				t.Errorf("processor: %v", err)
			}
		})
	}
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); wg.Wait() }) }
	t.Cleanup(stop)
	return stop
}

func waitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// row is an inbox row's bookkeeping.
type row struct {
	Status        string
	Attempts      int
	LastError     *string
	NextAttemptAt time.Time
	LastAttemptAt *time.Time
	ProcessedAt   *time.Time
}

func inboxRow(t testing.TB, pool *pgxpool.Pool, consumer string, id uuid.UUID) row {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT status, attempts, last_error, next_attempt_at, last_attempt_at, processed_at
		FROM inbox WHERE consumer = $1 AND message_id = $2`, consumer, id)
	if err != nil {
		t.Fatal(err)
	}
	r, err := pgx.CollectExactlyOneRow(rows, pgx.RowToStructByPos[row])
	if err != nil {
		t.Fatalf("inbox row %s: %v", id, err)
	}
	return r
}

func receive(t testing.TB, in *idempotent.Inbox, e events.Envelope) {
	t.Helper()
	stored, err := in.Receive(context.Background(), e, idempotent.ByAggregate(e))
	if err != nil || !stored {
		t.Fatalf("receive %s: stored=%v err=%v", e.EventID, stored, err)
	}
}

// appliedVersions returns, per key, the versions in the order they were applied.
func appliedVersions(t testing.TB, pool *pgxpool.Pool) map[string][]int64 {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT ordering_key, version FROM applied ORDER BY seq`)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]int64{}
	var k string
	var v int64
	if _, err := pgx.ForEachRow(rows, []any{&k, &v}, func() error { out[k] = append(out[k], v); return nil }); err != nil {
		t.Fatal(err)
	}
	return out
}

var errFlaky = errors.New("provider unavailable")

func mustJSON(t testing.TB, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// callCounter counts handler calls per event.
type callCounter struct {
	mu sync.Mutex
	n  map[uuid.UUID]int
}

func (c *callCounter) inc(id uuid.UUID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[uuid.UUID]int{}
	}
	c.n[id]++
}

func (c *callCounter) get(id uuid.UUID) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[id]
}

// otherPool opens a second pool on the database of pool, with maxConns
// connections: processors get their own, as ProcessorConfig.Pool advises.
func otherPool(t testing.TB, pool *pgxpool.Pool, maxConns int) *pgxpool.Pool {
	t.Helper()
	cfg := pool.Config()
	cfg.MaxConns = int32(maxConns)
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// countRows is count for benchmarks too.
func countRows(t testing.TB, pool *pgxpool.Pool, sql string, args ...any) int64 {
	t.Helper()
	var n int64
	if err := pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}
