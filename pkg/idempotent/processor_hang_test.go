package idempotent_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/effectively-once/payments-cashback/pkg/events"
	"github.com/effectively-once/payments-cashback/pkg/idempotent"
)

// A handler cut at HandlerTimeout while its statement runs (a lock wait, a
// slow query) loses its connection (pgx closes it on a cancelled query),
// and the batch's transaction with it. The row that hung is charged the
// attempt, with the deadline as its last error; its batch-mates, cut off
// by someone else's hang, are not: they run again at once, and end DONE
// instead of FAILED after MaxAttempts of other rows' hangs.
func TestAQueryCutByTheHandlerDeadlineChargesItsRowNotItsBatchMates(t *testing.T) {
	pool := inboxSetup(t)
	in := newInbox(t, pool, "notifications", idempotent.InboxConfig{})
	hung, healthy := keyedEvent(t, "cb_hung", 1), keyedEvent(t, "cb_healthy", 1)
	receive(t, in, hung)
	receive(t, in, healthy)
	h := func(ctx context.Context, tx pgx.Tx, e events.Envelope) error {
		if e.AggregateID == "cb_hung" {
			_, err := tx.Exec(ctx, `SELECT pg_sleep(5)`)
			return err
		}
		return record(ctx, tx, e)
	}
	p, err := in.NewProcessor(h, idempotent.ProcessorConfig{BatchSize: 10, MaxAttempts: 3,
		HandlerTimeout: 200 * time.Millisecond, ClaimHold: 10 * time.Millisecond,
		RetryBase: 10 * time.Millisecond, RetryMax: 20 * time.Millisecond, Pool: otherPool(t, pool, 4)})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for range 8 {
		if _, err := p.ProcessOnce(ctx); err != nil {
			t.Logf("pass: %v", err)
		}
		time.Sleep(60 * time.Millisecond)
	}
	if r := inboxRow(t, pool, "notifications", healthy.EventID); r.Status != "DONE" {
		t.Errorf("the healthy batch-mate is %s after %d attempts (%v), want DONE", r.Status, r.Attempts, r.LastError)
	}
	r := inboxRow(t, pool, "notifications", hung.EventID)
	if r.Status != "FAILED" || r.LastError == nil || !strings.Contains(*r.LastError, "deadline") {
		t.Errorf("the hung row is %s after %d attempts, last error %v; want FAILED with its deadline", r.Status, r.Attempts, r.LastError)
	}
}
