package sender_test

import (
	"context"
	"testing"
	"time"

	"github.com/effectively-once/payments-cashback/services/notifications/intent/compose"
	"github.com/effectively-once/payments-cashback/services/notifications/sender"
	"github.com/effectively-once/payments-cashback/services/notifications/sms"
)

// Shutdown (Run's context cancelled) arrives while the claim UPDATE is
// running, past the point where a cancel stops it (here a trigger that
// sleeps and swallows the cancel; in production, say, a commit waiting for
// a synchronous standby). The claim commits, so its rows are SENDING: they
// must still be sent and recorded before Run returns, since Run promises a
// clean shutdown leaves no row SENDING. Left SENDING with no call made,
// they would be reconciled after the lease as an unknown outcome, and
// under policy skip an SMS never sent would end FAILED.
func TestShutdownDuringTheClaimSendsTheRowsItClaimed(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	if _, err := e.pool.Exec(ctx, `
		CREATE FUNCTION slow_claim() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF OLD.status = 'PENDING' AND NEW.status = 'SENDING' THEN
				BEGIN PERFORM pg_sleep(0.3); EXCEPTION WHEN query_canceled THEN NULL; END;
			END IF;
			RETURN NEW;
		END $$;
		CREATE TRIGGER slow_claim BEFORE UPDATE ON notifications
			FOR EACH ROW EXECUTE FUNCTION slow_claim();`); err != nil {
		t.Fatal(err)
	}
	ev := e.intent()
	cfg := fast()
	// The claim is bounded by SendTimeout: longer than the trigger's sleep.
	cfg.SendTimeout, cfg.Lease = time.Second, 2*time.Second
	cfg.Policies = map[string]sender.Policy{compose.KindCashback: sender.PolicySkip}
	s := e.sender(sms.WithoutLookup(e.client), cfg)

	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- s.Run(rctx) }()
	// Cancel once the claim is inside the trigger's sleep.
	deadline := time.Now().Add(5 * time.Second)
	for {
		var sleeping bool
		if err := e.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event = 'PgSleep')`).Scan(&sleeping); err != nil {
			t.Fatal(err)
		}
		if sleeping {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the claim never reached the trigger")
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel() // SIGTERM
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// Wait for the server to finish the claim, whatever Run did with it.
	r := e.row(ev)
	for deadline := time.Now().Add(3 * time.Second); r.Status == "PENDING" && time.Now().Before(deadline); r = e.row(ev) {
		time.Sleep(20 * time.Millisecond)
	}
	d, delivered := e.delivery(r.Key)
	if r.Status != "SENT" || r.Attempts != 1 || !delivered || d.Requests != 1 || deref(r.MessageID) != d.MessageID {
		t.Errorf("after a clean shutdown during the claim: row %+v, delivery %+v (delivered %v); want SENT after 1 attempt, delivered once",
			r, d, delivered)
	}
}
