package e2e

import (
	"fmt"
	"testing"
	"time"

	"github.com/effectively-once/payments-cashback/services/contract"
)

// Scenario 5. The handler fails twice (after writing the dedupe row, the
// credit, the wallet and the outbox row, just before COMMIT). A failed
// attempt commits nothing, the dedupe key included, so it is not "done":
// the third delivery applies it. Between the failures the databases show
// no trace of the event.
func TestFailedHandlerCommitsNoDedupeRowAndTheRetryApplies(t *testing.T) {
	user, payID := id("u_e2e5"), id("pay_e2e5")
	e := paymentEvent(t, contract.PaymentSucceeded, payID, user, 120000, 1)
	// Two failures, each followed by a 2 s redelivery backoff: the window
	// in which the test looks.
	restartWith(t, "rewards", "REWARDS_FAIL_EVENT_IDS="+e.EventID.String()+"@2",
		"SUBSCRIBER_RETRY_BASE=2s", "SUBSCRIBER_RETRY_MAX=2s")

	nothing := func(after int) {
		t.Helper()
		checks := []struct {
			what string
			n    int64
		}{
			{"dedupe rows", processed(t, e.EventID)},
			{"credits", count(t, s.rewDB, `SELECT count(*) FROM cashback_credits WHERE payment_id = $1`, payID)},
			{"payment_versions rows", count(t, s.rewDB, `SELECT count(*) FROM payment_versions WHERE payment_id = $1`, payID)},
			{"wallet rows", count(t, s.rewDB, `SELECT count(*) FROM wallets WHERE user_id = $1`, user)},
			{"outbox rows", count(t, s.rewDB, `SELECT count(*) FROM outbox WHERE aggregate_id = $1`, payID)},
		}
		for _, c := range checks {
			if c.n != 0 {
				t.Errorf("after failed attempt %d: %d %s for the event, want 0", after, c.n, c.what)
			}
		}
	}
	send(t, s.payQ, e)
	for attempt := 1; attempt <= 2; attempt++ {
		eventually(t, 30*time.Second, func() (bool, string) {
			n := metric(t, s.rewardsURL, "rewards_injected_failures_total")
			return n >= float64(attempt), fmt.Sprintf("%v injected failures, waiting for %d", n, attempt)
		})
		nothing(attempt)
	}

	c, _ := pipelineOnce(t, payID, 2400)
	if c.EventID != e.EventID {
		t.Errorf("credited by %s, want %s", c.EventID, e.EventID)
	}
	if n := processed(t, e.EventID); n != 1 {
		t.Errorf("%d dedupe rows after the retry, want 1", n)
	}
	if n := metric(t, s.rewardsURL, "rewards_injected_failures_total"); n != 2 {
		t.Errorf("%v injected failures, want 2", n)
	}
	if n := metric(t, s.rewardsURL, "idempotent_messages_total", "consumer", "rewards", "outcome", "failed"); n != 2 {
		t.Errorf("idempotent_messages_total{outcome=failed} = %v, want 2", n)
	}
	if n := metric(t, s.rewardsURL, "idempotent_messages_total", "consumer", "rewards", "outcome", "applied"); n != 1 {
		t.Errorf("idempotent_messages_total{outcome=applied} = %v, want 1", n)
	}
	if b := walletBalance(t, user); b != 2400 {
		t.Errorf("wallet of %s = %d paise, want 2400", user, b)
	}
	waitLog(t, "rewards", 2, "effect failed: rolled back, left for redelivery", e.EventID.String())
}
