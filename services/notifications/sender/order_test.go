package sender_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/effectively-once/payments-cashback/pkg/events"
	"github.com/effectively-once/payments-cashback/services/contract"
	"github.com/effectively-once/payments-cashback/services/notifications/intent"
	"github.com/effectively-once/payments-cashback/services/notifications/smsprovider"
)

// recordFor records the intent of a cashback event of version v of pay.
func (e *env) recordFor(pay, eventType string, v int64) {
	e.t.Helper()
	if !e.record(pay, eventType, v, 2400) {
		e.t.Fatalf("record %s v%d: not recorded", eventType, v)
	}
}

// record applies a cashback event of amount paise, version v of pay, to
// intent.Record in a transaction of its own, and reports whether it
// recorded an SMS.
func (e *env) record(pay, eventType string, v, amount int64) bool {
	e.t.Helper()
	ctx := context.Background()
	ev, err := events.New(eventType, pay, v, map[string]any{
		"payment_id": pay, "user_id": "u_1", "amount_paise": amount, "rate_bp": 200, "recipient": "+919800000099"})
	if err != nil {
		e.t.Fatal(err)
	}
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	recorded, err := intent.Record(ctx, slog.New(slog.DiscardHandler), tx, ev)
	if err != nil {
		e.t.Fatalf("record %s v%d: %v", eventType, v, err)
	}
	if err := tx.Commit(ctx); err != nil {
		e.t.Fatal(err)
	}
	return recorded
}

// bodies are the SMS the provider accepted, in the order it accepted them.
func (e *env) bodies() []string {
	var out []string
	for _, d := range e.provider.Deliveries() {
		out = append(out, d.Body)
	}
	return out
}

// wantCreditThenReversal fails unless the provider accepted exactly the
// credit's SMS and then the reversal's.
func wantCreditThenReversal(t *testing.T, got []string) {
	t.Helper()
	if len(got) != 2 || !strings.HasPrefix(got[0], "You got") || !strings.Contains(got[1], "reversed") {
		t.Fatalf("SMS accepted, in order: %q; want the credit's, then the reversal's", got)
	}
}

// A payment's SMS go out in version order: the reversal, recorded while
// the credit's SMS waits out a retryable refusal, is not sent before it
// (the customer would be told "it is in your wallet" after "reversed").
func TestAReversalRecordedWhileTheCreditsSMSBacksOffIsSentAfterIt(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	e.recordFor("pay_order_1", contract.CashbackCredited, 1)
	fail, status := 1, 429
	e.provider.SetControl(smsprovider.Control{FailNext: &fail, FailStatus: &status})
	cfg := fast()
	cfg.RetryBase, cfg.RetryMax = 300*time.Millisecond, 300*time.Millisecond
	s := e.sender(e.client, cfg)
	if n, err := s.SendOnce(ctx); err != nil || n != 1 {
		t.Fatalf("first pass claimed %d, %v; want the credit's SMS", n, err)
	}
	if got := e.bodies(); len(got) != 0 {
		t.Fatalf("the 429 was accepted: %q", got)
	}
	e.recordFor("pay_order_1", contract.CashbackReversed, 2)
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end) && len(e.bodies()) < 2; {
		if _, err := s.SendOnce(ctx); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	wantCreditThenReversal(t, e.bodies())
}

// Both due at once, one pass claims only the older: sent side by side,
// the provider could take them in either order.
func TestOnePassClaimsOnlyTheOldestOpenSMSOfAPayment(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	e.recordFor("pay_order_2", contract.CashbackCredited, 1)
	e.recordFor("pay_order_2", contract.CashbackReversed, 2)
	e.intent() // another payment's SMS is not held back
	s := e.sender(e.client, fast())
	if n, err := s.SendOnce(ctx); err != nil || n != 2 {
		t.Fatalf("first pass claimed %d, %v; want the credit's and the other payment's", n, err)
	}
	if n, err := s.SendOnce(ctx); err != nil || n != 1 {
		t.Fatalf("second pass claimed %d, %v; want the reversal's", n, err)
	}
	var got []string
	for _, b := range e.bodies() {
		if strings.Contains(b, "pay_order_2") {
			got = append(got, b)
		}
	}
	wantCreditThenReversal(t, got)
}

// A cashback of 0 paise records no intent, so nothing is sent; its version
// is still recorded, so a copy of an older event stays refused.
func TestACashbackOfZeroPaiseRecordsNoSMSButItsVersion(t *testing.T) {
	e := setup(t)
	if e.record("pay_zero", contract.CashbackCredited, 2, 0) {
		t.Fatalf("Record of a 0-paise credit recorded an SMS; want none")
	}
	var rows, version int
	if err := e.pool.QueryRow(context.Background(), `SELECT (SELECT count(*) FROM notifications),
		(SELECT coalesce(max(version), 0) FROM notification_versions WHERE aggregate_id = 'pay_zero')`).Scan(&rows, &version); err != nil {
		t.Fatal(err)
	}
	if rows != 0 || version != 2 {
		t.Fatalf("%d notification rows and version %d recorded; want none and 2", rows, version)
	}
}
