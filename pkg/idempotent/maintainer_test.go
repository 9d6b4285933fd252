package idempotent_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/effectively-once/payments-cashback/pkg/events"
	"github.com/effectively-once/payments-cashback/pkg/idempotent"
)

func partitions(t testing.TB, pool *pgxpool.Pool) []string {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT c.relname FROM pg_inherits i
		JOIN pg_class c ON c.oid = i.inhrelid JOIN pg_class p ON p.oid = i.inhparent
		WHERE p.relname = 'processed_messages' ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return names
}

func partitionOf(d time.Time) string { return "processed_messages_p" + d.UTC().Format("20060102") }

// Twenty days on (by an injected clock), the maintenance loop drops the
// partitions that fell out of the 15-day window, creates the days ahead,
// deletes the expired DONE inbox rows and keeps PENDING and FAILED ones;
// and a copy of an event from back then is refused.
func TestMaintainerDropsExpiredPartitionsAndCleansTheInbox(t *testing.T) {
	t.Parallel()
	pool := inboxSetup(t)
	ctx := context.Background()
	now := time.Now()
	if ps := partitions(t, pool); !slices.Contains(ps, partitionOf(now)) || len(ps) != 15+1+3 {
		t.Fatalf("after Migrate: %d partitions %v, want today's among 19", len(ps), ps)
	}
	c := newConsumer(t, pool)
	e := newEvent(t, 2400)
	if out, err := c.Handle(ctx, idempotent.MessageOf(e), credit(e, 2400)); out != idempotent.Applied {
		t.Fatal(out, err)
	}

	in := newInbox(t, pool, "notifications", idempotent.InboxConfig{})
	done, failed, pending := keyedEvent(t, "cb_done", 1), keyedEvent(t, "cb_failed", 1), keyedEvent(t, "cb_failed", 2)
	for _, ev := range []events.Envelope{done, failed, pending} {
		receive(t, in, ev)
	}
	p, err := in.NewProcessor(func(ctx context.Context, tx pgx.Tx, e events.Envelope) error {
		if e.EventID == failed.EventID {
			return idempotent.Permanent(errors.New("poison"))
		}
		return record(ctx, tx, e)
	}, idempotent.ProcessorConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.ProcessOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if n := count(t, pool, `SELECT count(*) FROM inbox WHERE status = 'DONE'`); n != 1 {
		t.Fatalf("DONE rows = %d, want 1", n)
	}

	later := now.Add(20 * 24 * time.Hour)
	m, err := idempotent.NewMaintainer(pool, idempotent.MaintainerConfig{Now: func() time.Time { return later }, Interval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	runCtx, stop := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- m.Run(runCtx) }()
	waitFor(t, 10*time.Second, "today's partition dropped by the loop", func() bool {
		return !slices.Contains(partitions(t, pool), partitionOf(now))
	})
	waitFor(t, 10*time.Second, "the inbox cleaned by the loop", func() bool {
		return count(t, pool, `SELECT count(*) FROM inbox WHERE status = 'DONE'`) == 0
	})
	stop()
	if err := <-ran; err != nil {
		t.Fatalf("Run: %v", err)
	}

	ps := partitions(t, pool)
	if !slices.Contains(ps, partitionOf(later.Add(3*24*time.Hour))) || !slices.Contains(ps, partitionOf(later.Add(-15*24*time.Hour))) {
		t.Fatalf("partitions %v: want the 15 days before %s and 3 ahead", ps, later.Format(time.DateOnly))
	}
	if ps[0] < partitionOf(later.Add(-15*24*time.Hour)) {
		t.Fatalf("partition %s is older than the window and was kept", ps[0])
	}
	if n := count(t, pool, `SELECT count(*) FROM processed_messages`); n != 0 {
		t.Fatalf("%d dedupe keys survived their partition", n)
	}
	if n := count(t, pool, `SELECT count(*) FROM inbox WHERE status IN ('PENDING', 'FAILED')`); n != 2 {
		t.Fatalf("unfinished rows = %d, want the FAILED one and the PENDING one behind it kept", n)
	}

	rep, err := m.RunOnce(ctx)
	if err != nil || len(rep.Created)+len(rep.Dropped) != 0 || rep.InboxDeleted != 0 {
		t.Fatalf("second round did %+v, %v; want nothing", rep, err)
	}

	// By the same clock, a copy of the applied event is now too old to trust.
	late := newInbox(t, pool, "notifications-later", idempotent.InboxConfig{Now: func() time.Time { return later }})
	if _, err := late.Receive(ctx, done, done.AggregateID); !errors.Is(err, idempotent.ErrExpired) {
		t.Fatalf("copy past the window: %v, want ErrExpired", err)
	}
}

// Creating and dropping partitions needs an ACCESS EXCLUSIVE lock on
// processed_messages. Behind a long transaction the maintainer gives up
// after LockTimeout instead of queueing (and stalling every insert behind
// it), and succeeds on a later round.
func TestMaintainerGivesUpOnLocksInsteadOfStallingConsumers(t *testing.T) {
	t.Parallel()
	pool := inboxSetup(t)
	ctx := context.Background()
	long, err := pool.Begin(ctx) // a consumer in the middle of a 40 s effect
	if err != nil {
		t.Fatal(err)
	}
	defer long.Rollback(ctx)
	e := newEvent(t, 1)
	if _, err := long.Exec(ctx, `INSERT INTO processed_messages (consumer, message_id, payload_hash) VALUES ('x', $1, '')`, e.EventID); err != nil {
		t.Fatal(err)
	}
	later := time.Now().Add(20 * 24 * time.Hour)
	m, err := idempotent.NewMaintainer(pool, idempotent.MaintainerConfig{Now: func() time.Time { return later }, LockTimeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()

	// A consumer keeps working meanwhile: its insert may wait for the
	// maintainer's queued lock, but only up to LockTimeout.
	c := newConsumer(t, pool)
	start := time.Now()
	rep, err := m.RunOnce(ctx)
	took := time.Since(start)
	if err == nil || !strings.Contains(err.Error(), "55P03") {
		t.Fatalf("RunOnce behind a long transaction: %+v, %v; want lock timeouts (55P03)", rep, err)
	}
	if took > 3*time.Second {
		t.Fatalf("RunOnce took %v, want about 2 x LockTimeout", took)
	}
	e2 := newEvent(t, 2)
	hstart := time.Now()
	if out, err := c.Handle(ctx, idempotent.MessageOf(e2), credit(e2, 2)); out != idempotent.Applied {
		t.Fatal(out, err)
	}
	if d := time.Since(hstart); d > time.Second {
		t.Fatalf("a consumer waited %v after the maintainer gave up", d)
	}

	if err := long.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	rep, err = m.RunOnce(ctx)
	if err != nil || len(rep.Dropped) == 0 || len(rep.Created) == 0 {
		t.Fatalf("next round: %+v, %v; want partitions created and dropped", rep, err)
	}
}
