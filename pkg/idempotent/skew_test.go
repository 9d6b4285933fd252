package idempotent_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/effectively-once/payments-cashback/pkg/events"
	"github.com/effectively-once/payments-cashback/pkg/idempotent"
)

// The Maintainer forgets a DONE inbox row by its own clock; a replica's
// Inbox decides whether a copy is too old by its own. With the maintainer's
// host one minute ahead and the receiving replica's one minute behind, a
// copy that arrived at the edge of the window used to be neither refused
// (ErrExpired) nor recognised as a duplicate: stored again and applied
// twice. The maintainer now forgets only ClockSkewMargin past the window,
// so clocks that disagree by less than that cannot open the gap.
func TestInboxCleanupAndReceiveOnSkewedClocksApplyOnce(t *testing.T) {
	t.Parallel()
	pool := inboxSetup(t)
	ctx := context.Background()
	e := keyedEvent(t, "cb_skew", 1)
	apply := func(ctx context.Context, tx pgx.Tx, e events.Envelope) error {
		_, err := tx.Exec(ctx, `INSERT INTO credits VALUES ($1, 100)`, e.EventID)
		return err
	}

	// First delivery, applied and DONE.
	first := newInbox(t, pool, "notifications", idempotent.InboxConfig{})
	receive(t, first, e)
	p1, err := first.NewProcessor(apply, idempotent.ProcessorConfig{Pool: otherPool(t, pool, 2)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p1.ProcessOnce(ctx); err != nil {
		t.Fatal(err)
	}

	// At the end of the window: maintainer host 1m ahead, replica 1m behind.
	edge := events.IDTime(e.EventID).Add(idempotent.DefaultRetention)
	m, err := idempotent.NewMaintainer(pool, idempotent.MaintainerConfig{Now: func() time.Time { return edge.Add(time.Minute) }})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if _, err := m.RunOnce(ctx); err != nil {
		t.Fatalf("maintainer: %v", err)
	}
	replica := newInbox(t, pool, "notifications", idempotent.InboxConfig{Now: func() time.Time { return edge.Add(-time.Minute) }})
	stored, err := replica.Receive(ctx, e, idempotent.ByAggregate(e))
	if err == nil && stored {
		p2, perr := replica.NewProcessor(apply, idempotent.ProcessorConfig{Pool: otherPool(t, pool, 2)})
		if perr != nil {
			t.Fatal(perr)
		}
		if _, perr := p2.ProcessOnce(ctx); perr != nil {
			t.Fatal(perr)
		}
	}
	if n := count(t, pool, `SELECT count(*) FROM credits WHERE event_id = $1`, e.EventID); n != 1 {
		t.Fatalf("event applied %d times (late copy: stored=%v err=%v); want once", n, stored, err)
	}

	// Past the margin by the maintainer's clock, the row is forgotten.
	later, err := idempotent.NewMaintainer(pool, idempotent.MaintainerConfig{
		Now: func() time.Time { return edge.Add(idempotent.ClockSkewMargin + time.Minute) }})
	if err != nil {
		t.Fatal(err)
	}
	defer later.Close()
	if rep, err := later.RunOnce(ctx); err != nil || rep.InboxDeleted != 1 {
		t.Fatalf("maintainer past the margin deleted %d DONE rows (%v), want 1", rep.InboxDeleted, err)
	}
}

// The same race on the Consumer's side: the maintainer, its clock ahead,
// dropped the day's partition of processed_messages, and a replica whose
// clock lags ran Migrate (EnsurePartitions), which recreated that day's
// partition empty: a late copy, still inside the window by the replica's
// clock, found no key and was applied again. Dropping a partition only
// ClockSkewMargin past the window keeps its keys for such a replica.
func TestPartitionDropAndALaggingReplicasMigrateApplyOnce(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	const r = idempotent.DefaultRetention
	day := time.Now().UTC().Truncate(24 * time.Hour)
	at := day.Add(24*time.Hour - 30*time.Second) // the last seconds of the day
	if _, err := idempotent.EnsurePartitionsAt(ctx, pool, at, r, idempotent.DefaultPartitionsAhead); err != nil {
		t.Fatal(err)
	}
	e := newEvent(t, 100)
	e.EventID = idAt(at)
	e.OccurredAt = at.Truncate(time.Microsecond)
	first := newConsumer(t, pool, idempotent.WithNow(func() time.Time { return at }))
	if out, err := first.Handle(ctx, idempotent.MessageOf(e), credit(e, 100)); out != idempotent.Applied {
		t.Fatalf("first delivery: %v, %v", out, err)
	}

	// The day has just left the window by the maintainer's clock (2 minutes
	// ahead of the replica's), and is still inside it by the replica's.
	maintainerNow := day.Add(24*time.Hour + r + time.Minute)
	replicaNow := maintainerNow.Add(-2 * time.Minute)
	m, err := idempotent.NewMaintainer(pool, idempotent.MaintainerConfig{Now: func() time.Time { return maintainerNow }})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if _, err := m.RunOnce(ctx); err != nil {
		t.Fatalf("maintainer: %v", err)
	}
	if _, err := idempotent.EnsurePartitionsAt(ctx, pool, replicaNow, r, idempotent.DefaultPartitionsAhead); err != nil {
		t.Fatal(err)
	}
	replica := newConsumer(t, pool, idempotent.WithNow(func() time.Time { return replicaNow }))
	out, err := replica.Handle(ctx, idempotent.MessageOf(e), credit(e, 100))
	if n := count(t, pool, `SELECT count(*) FROM credits WHERE event_id = $1`, e.EventID); n != 1 {
		t.Fatalf("event applied %d times (late copy: %v, %v); want once", n, out, err)
	}
	if out != idempotent.Duplicate {
		t.Errorf("late copy: %v, %v; want Duplicate", out, err)
	}
}
