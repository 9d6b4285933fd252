package outbox_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/effectively-once/payments-cashback/pkg/events"
	"github.com/effectively-once/payments-cashback/pkg/outbox"
)

// Add writes inside the caller's transaction: a rolled-back transaction
// leaves no row and nothing is ever published for it; a committed one is
// published once, with the envelope as body and event_id, event_type and
// the producer's traceparent as attributes.
func TestAddWritesInsideCallersTransaction(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	c, q, pub := queue(t)
	relay := newRelay(t, pool, pub, outbox.RelayConfig{})

	tp := sdktrace.NewTracerProvider()
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	ctx, span := tp.Tracer("test").Start(context.Background(), "POST /v1/payments")
	defer span.End()

	// Rolled back: the row exists inside the transaction, and not after.
	rolled := newEvent(t, 1)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := outbox.Add(ctx, tx, rolled); err != nil {
		t.Fatal(err)
	}
	var inside int
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE id = $1`, rolled.EventID).Scan(&inside); err != nil || inside != 1 {
		t.Fatalf("row inside the transaction: %d, %v; want 1", inside, err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}

	// Committed: invisible to the relay until COMMIT, published after.
	committed := newEvent(t, 2)
	tx, err = pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := outbox.Add(ctx, tx, committed); err != nil {
		t.Fatal(err)
	}
	if n, err := relay.RelayOnce(ctx); err != nil || n != 0 {
		t.Fatalf("RelayOnce before COMMIT claimed %d (%v), want 0", n, err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if n, err := relay.RelayOnce(ctx); err != nil || n != 1 {
		t.Fatalf("RelayOnce after COMMIT claimed %d (%v), want 1", n, err)
	}
	if n, err := relay.RelayOnce(ctx); err != nil || n != 0 {
		t.Fatalf("RelayOnce after publishing claimed %d (%v), want 0", n, err)
	}

	if n := count(t, pool, `SELECT count(*) FROM outbox WHERE id = $1`, rolled.EventID); n != 0 {
		t.Fatalf("rolled-back event has %d outbox rows, want 0", n)
	}
	if n := count(t, pool, `SELECT count(*) FROM outbox WHERE id = $1 AND published_at IS NOT NULL AND attempts = 1 AND last_error IS NULL`, committed.EventID); n != 1 {
		t.Fatalf("committed event not marked published after one attempt")
	}

	// Exactly one message: wait for a second one that must not come.
	got := receive(t, c, q, 2, 3*time.Second, true)
	if len(got) != 1 {
		t.Fatalf("received %d messages, want exactly 1 (the committed event)", len(got))
	}
	m := got[0]
	dec, err := events.Decode(m.Body)
	if err != nil {
		t.Fatalf("body does not decode: %v\n%s", err, m.Body)
	}
	if dec.EventID != committed.EventID || dec.EventType != committed.EventType || dec.AggregateID != committed.AggregateID ||
		dec.AggregateVersion != committed.AggregateVersion || !dec.OccurredAt.Equal(committed.OccurredAt) {
		t.Errorf("decoded envelope %+v, want %+v", dec, committed)
	}
	if !jsonEqual(t, dec.Payload, committed.Payload) {
		t.Errorf("payload %s, want %s", dec.Payload, committed.Payload)
	}
	if want, _ := committed.Marshal(); !bytes.Equal(m.Body, want) {
		// jsonb stores object keys in its own order (shorter keys first), so
		// the relayed payload may list keys in another order than the
		// producer wrote them; the envelope is the same JSON value.
		t.Logf("note: body bytes differ from the producer's encoding (jsonb key order):\n got %s\nwant %s", m.Body, want)
	}

	if m.Attributes["event_id"] != committed.EventID.String() || m.Attributes["event_type"] != "PaymentSucceeded" {
		t.Errorf("attributes %v, want event_id %s and event_type %s", m.Attributes, committed.EventID, "PaymentSucceeded")
	}
	tpHeader := m.Attributes["traceparent"]
	parts := strings.Split(tpHeader, "-")
	sc := span.SpanContext()
	if len(parts) != 4 || parts[0] != "00" || parts[1] != sc.TraceID().String() || parts[2] != sc.SpanID().String() || parts[3] != "01" {
		t.Errorf("traceparent %q, want 00-%s-%s-01 (the producer's span)", tpHeader, sc.TraceID(), sc.SpanID())
	}
}

// Add without a span stores no traceparent, and the message carries none.
// It validates the envelope, and adding the same event twice fails on the
// primary key instead of publishing it twice.
func TestAddValidatesAndRefusesDuplicates(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	ctx := context.Background()
	c, q, pub := queue(t)

	bad := newEvent(t, 1)
	bad.Payload = json.RawMessage(`[1,2]`)
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return outbox.Add(ctx, tx, bad) })
	if !events.IsDecodeError(err) {
		t.Fatalf("Add of an invalid envelope: %v, want a *events.DecodeError", err)
	}

	e := newEvent(t, 2)
	addCommitted(t, ctx, pool, e)
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return outbox.Add(ctx, tx, e) })
	if err == nil || !strings.Contains(err.Error(), "outbox_pkey") {
		t.Fatalf("second Add of the same event: %v, want a primary key violation", err)
	}
	if n := count(t, pool, `SELECT count(*) FROM outbox`); n != 1 {
		t.Fatalf("outbox rows = %d, want 1", n)
	}
	if n, err := newRelay(t, pool, pub, outbox.RelayConfig{}).RelayOnce(ctx); n != 1 || err != nil {
		t.Fatalf("RelayOnce: %d, %v", n, err)
	}
	got := receive(t, c, q, 1, 5*time.Second, true)
	if len(got) != 1 {
		t.Fatalf("received %d, want 1", len(got))
	}
	if tp, ok := got[0].Attributes["traceparent"]; ok {
		t.Errorf("traceparent %q without a span in the producer's context, want none", tp)
	}
}

func jsonEqual(t *testing.T, a, b []byte) bool {
	t.Helper()
	var x, y any
	if err := errors.Join(json.Unmarshal(a, &x), json.Unmarshal(b, &y)); err != nil {
		t.Fatal(err)
	}
	return reflect.DeepEqual(x, y)
}

// QueueAdd puts the row in the caller's pgx.Batch: it is written when the
// batch is sent in a transaction and exists exactly when that transaction
// commits, with the trace context of its ctx, as Add's rows are; an invalid
// event queues nothing.
func TestQueueAddWritesWithTheBatchInTheCallersTransaction(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	tp := sdktrace.NewTracerProvider()
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	ctx, span := tp.Tracer("test").Start(context.Background(), "apply batch")
	defer span.End()

	send := func(commit bool, es ...events.Envelope) {
		t.Helper()
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			b := &pgx.Batch{}
			b.Queue(`SELECT 1`)
			for _, e := range es {
				if err := outbox.QueueAdd(ctx, b, e); err != nil {
					return err
				}
			}
			if err := tx.SendBatch(ctx, b).Close(); err != nil {
				return err
			}
			if !commit {
				return errors.New("roll back")
			}
			return nil
		})
		if commit && err != nil {
			t.Fatal(err)
		}
	}
	rolled, kept1, kept2 := newEvent(t, 1), newEvent(t, 2), newEvent(t, 3)
	send(false, rolled)
	send(true, kept1, kept2)
	var ids []string
	rows, err := pool.Query(ctx, `SELECT id::text FROM outbox WHERE headers->>'traceparent' LIKE '00-'||$1||'-%' ORDER BY id`,
		span.SpanContext().TraceID().String())
	if err != nil {
		t.Fatal(err)
	}
	if ids, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
		t.Fatal(err)
	}
	if want := []string{kept1.EventID.String(), kept2.EventID.String()}; !reflect.DeepEqual(ids, want) {
		t.Fatalf("rows with the batch's trace context: %v, want %v (the rolled-back one absent)", ids, want)
	}

	bad := newEvent(t, 4)
	bad.EventType = ""
	b := &pgx.Batch{}
	if err := outbox.QueueAdd(ctx, b, bad); err == nil || b.Len() != 0 {
		t.Fatalf("invalid event: err %v, %d statements queued; want an error and none", err, b.Len())
	}
}
