package e2e

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/effectively-once/payments-cashback/services/contract"
)

type rate struct {
	EffectiveFrom time.Time `json:"effective_from"`
	RateBP        int       `json:"rate_bp"`
}

// setRate schedules bp as the dev operator (REWARDS_ADMIN_KEY), starting
// the minimum lead from now, and waits until it is in force.
func setRate(t testing.TB, bp int) rate {
	t.Helper()
	code, _, b := do(t, http.MethodPost, s.rewardsURL+"/v1/cashback-rates", nil, map[string]any{"rate_bp": bp})
	if code != http.StatusCreated {
		t.Fatalf("POST /v1/cashback-rates %d: %d %s", bp, code, b)
	}
	r := decode[rate](t, b)
	if wait := time.Until(r.EffectiveFrom); wait > 0 {
		if wait > 10*time.Second {
			t.Fatalf("the rate takes effect in %v: the stack's REWARDS_RATE_MIN_LEAD is too long for the suite", wait)
		}
		time.Sleep(wait + 50*time.Millisecond) // the database's clock and ours
	}
	return r
}

// Scenario 8. A non-deterministic handler would read "the rate now". The
// first attempt fails at 2%; the rate goes to 5% before the retry; the
// retry still credits the rate in force at the event's occurred_at: ₹24.
// A payment that happens after the change gets 5%, so the change was real.
func TestRateChangeBetweenTheFailedAttemptAndTheRetryStillCreditsTheRateAtOccurredAt(t *testing.T) {
	user, payID := id("u_e2e8"), id("pay_e2e8")
	e := paymentEvent(t, contract.PaymentSucceeded, payID, user, 120000, 1)
	restartWith(t, "rewards", "REWARDS_FAIL_EVENT_IDS="+e.EventID.String()+"@1",
		"SUBSCRIBER_RETRY_BASE=3s", "SUBSCRIBER_RETRY_MAX=3s")

	send(t, s.payQ, e)
	eventually(t, 30*time.Second, func() (bool, string) {
		n := metric(t, s.rewardsURL, "rewards_injected_failures_total")
		return n == 1, fmt.Sprintf("%v injected failures, want the first attempt failed", n)
	})
	// Between the failure and the retry (3 s later), the rate changes.
	five := setRate(t, 500)
	t.Cleanup(func() { setRate(t, 200) }) // the rest of the suite runs at 2% again
	if !five.EffectiveFrom.After(e.OccurredAt) {
		t.Fatalf("the new rate takes effect at %v, not after the event (%v)", five.EffectiveFrom, e.OccurredAt)
	}

	c, _ := pipelineOnce(t, payID, 2400)
	if c.RateBP != 200 {
		t.Errorf("credited at %d bp, want 200 (in force at occurred_at)", c.RateBP)
	}
	if !c.CreditedAt.After(five.EffectiveFrom) {
		t.Errorf("credited at %v, before the rate change at %v: the retry did not run under the new rate", c.CreditedAt, five.EffectiveFrom)
	}
	if n := metric(t, s.rewardsURL, "rewards_injected_failures_total"); n != 1 {
		t.Errorf("%v injected failures, want 1", n)
	}

	// A payment after the change is credited 5%.
	later := pay(t, id("u_e2e8b"), 120000)
	c2, _ := pipelineOnce(t, later.ID, 6000)
	if c2.RateBP != 500 {
		t.Errorf("the later payment was credited at %d bp, want 500", c2.RateBP)
	}
	if b := walletBalance(t, user); b != 2400 {
		t.Errorf("wallet of %s = %d paise, want 2400", user, b)
	}
}
