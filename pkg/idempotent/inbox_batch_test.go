package idempotent_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/effectively-once/payments-cashback/pkg/idempotent"
)

// ReceiveBatch decides each message as Receive would, with the new ones of
// the whole batch stored by one statement (one transaction, one commit):
// new rows stored; a copy already stored, or twice in the batch, is a
// duplicate (nil, acked); the same id with another payload, a copy older
// than the window and an invalid envelope are refused permanently; and
// refusals do not keep the rest from being stored.
func TestInboxReceiveBatchStoresNewOnesInOneStatementAndJudgesEachCopy(t *testing.T) {
	t.Parallel()
	pool := inboxSetup(t)
	m := newMetrics()
	in := newInbox(t, pool, "notifications", idempotent.InboxConfig{MeterProvider: m.Provider})
	ctx := context.Background()
	before := keyedEvent(t, "cb_0", 1)
	if stored, err := in.Receive(ctx, before, "cb_0"); !stored || err != nil {
		t.Fatal("setup:", stored, err)
	}
	var ms []idempotent.Incoming
	for _, k := range []string{"cb_1", "cb_2", "cb_3", "cb_4", "cb_5"} {
		ms = append(ms, idempotent.Incoming{Envelope: keyedEvent(t, k, 1), OrderingKey: k})
	}
	forged := before
	forged.Payload = []byte(`{"key":"cb_0","version":1,"amount_paise":999999}`)
	old := keyedEvent(t, "cb_6", 1)
	old.EventID = v7At(time.Now().Add(-400 * time.Hour))
	old.OccurredAt = time.Now().Add(-400 * time.Hour)
	invalid := keyedEvent(t, "cb_7", 1)
	invalid.EventType = ""
	ms = append(ms,
		idempotent.Incoming{Envelope: before, OrderingKey: "cb_0"},         // 5: stored before: duplicate
		idempotent.Incoming{Envelope: ms[1].Envelope, OrderingKey: "cb_2"}, // 6: twice in the batch: duplicate
		idempotent.Incoming{Envelope: forged, OrderingKey: "cb_0"},         // 7: conflict
		idempotent.Incoming{Envelope: old, OrderingKey: "cb_6"},            // 8: expired
		idempotent.Incoming{Envelope: invalid, OrderingKey: "cb_7"},        // 9: invalid
	)
	errs := in.ReceiveBatch(ctx, ms)
	for i, err := range errs {
		switch {
		case i <= 6 && err != nil:
			t.Errorf("message %d: %v, want nil (stored or duplicate)", i, err)
		case i == 7 && !errors.Is(err, idempotent.ErrConflict):
			t.Errorf("forged copy: %v, want ErrConflict", err)
		case i == 8 && !errors.Is(err, idempotent.ErrExpired):
			t.Errorf("old copy: %v, want ErrExpired", err)
		case i >= 7 && !idempotent.IsPermanent(err):
			t.Errorf("message %d: %v, want a permanent refusal", i, err)
		}
	}
	if n := count(t, pool, `SELECT count(*) FROM inbox`); n != 6 {
		t.Fatalf("inbox rows = %d, want 6 (1 before + 5 new)", n)
	}
	if n := count(t, pool, `SELECT count(DISTINCT xmin::text) FROM inbox WHERE ordering_key <> 'cb_0'`); n != 1 {
		t.Errorf("the 5 new rows were written by %d transactions, want 1", n)
	}
	if r := inboxRow(t, pool, "notifications", ms[0].Envelope.EventID); r.Status != "PENDING" || r.Attempts != 0 {
		t.Errorf("stored row %+v, want PENDING with 0 attempts", r)
	}
	for outcome, want := range map[string]float64{"stored": 6, "duplicate": 2, "conflict": 1, "expired": 1, "invalid": 1} {
		if got := m.Value(t, "inbox_received_total", "consumer", "notifications", "outcome", outcome); got != want {
			t.Errorf("inbox_received_total{outcome=%s} = %v, want %v", outcome, got, want)
		}
	}
}

// A batch that cannot be stored (the database refuses the statement)
// stores nothing and leaves every message for redelivery: transient errors.
func TestInboxReceiveBatchFailureStoresNothing(t *testing.T) {
	t.Parallel()
	pool := inboxSetup(t)
	in := newInbox(t, pool, "notifications", idempotent.InboxConfig{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	ms := []idempotent.Incoming{{Envelope: keyedEvent(t, "cb_1", 1), OrderingKey: "cb_1"}, {Envelope: keyedEvent(t, "cb_2", 1), OrderingKey: "cb_2"}}
	for i, err := range in.ReceiveBatch(ctx, ms) {
		if err == nil || idempotent.IsPermanent(err) {
			t.Errorf("message %d: %v, want a transient error", i, err)
		}
	}
	if n := count(t, pool, `SELECT count(*) FROM inbox`); n != 0 {
		t.Fatalf("inbox rows = %d, want 0", n)
	}
}
