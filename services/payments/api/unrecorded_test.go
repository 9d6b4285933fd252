package api_test

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"time"
)

// failWritesAfter makes the database refuse op (INSERT or UPDATE) on
// payments from the moment Stripe is first called at path, as a database
// that fails over right after Stripe answered would; the returned function
// brings it back.
func (e *env) failWritesAfter(t *testing.T, path, op string) (back func()) {
	t.Helper()
	ctx := context.Background()
	var once sync.Once
	e.stripe.setHook(func(w http.ResponseWriter, r *http.Request) bool {
		if r.URL.Path == path {
			once.Do(func() {
				if _, err := e.pool.Exec(ctx, `
CREATE FUNCTION fail_payments() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'the database is failing over'; END $$;
CREATE TRIGGER fail_payments BEFORE `+op+` ON payments FOR EACH ROW EXECUTE FUNCTION fail_payments();`); err != nil {
					t.Error(err)
				}
			})
		}
		return false // stripe-mock answers: the money moves
	})
	return func() {
		if _, err := e.pool.Exec(ctx, `DROP TRIGGER fail_payments ON payments; DROP FUNCTION fail_payments()`); err != nil {
			t.Fatal(err)
		}
	}
}

// resumeAfter runs Resume once the lease of the client's attempt has run
// out, and returns how many operations it finished.
func (e *env) resumeAfter(t *testing.T, lease time.Duration) int {
	t.Helper()
	time.Sleep(lease + 200*time.Millisecond)
	n, err := e.keys.Resume(context.Background(), time.Hour, e.srv.Resume)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// Stripe charged the card, then the commit of the payment failed. The
// client got a 500 and may never retry: the key is marked for Resume,
// which records the charge (Stripe answers its repeat from the first
// call's record) with its PaymentSucceeded row. It used to be released as
// a failure that had done nothing, and no payment was ever recorded for
// the money taken.
func TestAChargeWhoseCommitFailedIsRecordedByResume(t *testing.T) {
	const lease = 400 * time.Millisecond
	e := newEnv(t, lease)
	back := e.failWritesAfter(t, chargesPath, "INSERT")
	r := e.create("k-1", validBody)
	back()
	if r.status != http.StatusInternalServerError {
		t.Fatalf("client got %d %s, want 500", r.status, r.body)
	}
	if d := r.errorDetail(t); d.Message != "internal error; retry with the same Idempotency-Key" {
		t.Errorf("client was told %q", d.Message)
	}
	n := e.resumeAfter(t, lease)
	if c := e.count(`SELECT count(*) FROM payments WHERE status = 'SUCCEEDED'`); n != 1 || c != 1 {
		t.Fatalf("Resume finished %d, %d payments; want the charge Stripe made recorded", n, c)
	}
	if rows := e.outbox(); len(rows) != 1 || rows[0].EventType != "PaymentSucceeded" {
		t.Errorf("outbox %+v, want one PaymentSucceeded", rows)
	}
	if charges := e.stripe.callsTo(chargesPath); len(charges) != 2 || charges[0].Key != charges[1].Key {
		t.Errorf("Stripe calls %+v, want the charge and Resume's repeat under the same key", charges)
	}
}

// The same for a refund: Stripe refunded, the commit failed, and Resume
// records the refund with its PaymentRefunded row.
func TestARefundWhoseCommitFailedIsRecordedByResume(t *testing.T) {
	const lease = 400 * time.Millisecond
	e := newEnv(t, lease)
	p := e.mustCreate("k-1")
	back := e.failWritesAfter(t, refundsPath, "UPDATE")
	r := e.refund(p.ID, "r-1")
	back()
	if r.status != http.StatusInternalServerError {
		t.Fatalf("client got %d %s, want 500", r.status, r.body)
	}
	n := e.resumeAfter(t, lease)
	if c := e.count(`SELECT count(*) FROM payments WHERE status = 'REFUNDED'`); n != 1 || c != 1 {
		t.Fatalf("Resume finished %d, %d refunded payments; want the refund Stripe made recorded", n, c)
	}
	if c := e.count(`SELECT count(*) FROM outbox WHERE event_type = 'PaymentRefunded'`); c != 1 {
		t.Errorf("PaymentRefunded rows = %d, want 1", c)
	}
}
