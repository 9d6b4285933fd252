package e2e

import (
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/effectively-once/payments-cashback/pkg/events"
	"github.com/effectively-once/payments-cashback/services/contract"
)

// Scenario 4. A buggy upstream emits PaymentSucceeded for the same payment
// twice, under two event ids, at the same moment. The dedupe key cannot
// tell them apart; the business key can: UNIQUE (payment_id) on
// cashback_credits. One credit, both messages committed (two dedupe rows)
// and acked, and a warning naming the second event id.
func TestSamePaymentUnderTwoEventIDsIsCreditedOnceBothAreAckedAndAWarningIsLogged(t *testing.T) {
	user, payID := id("u_e2e4"), id("pay_e2e4")
	first := paymentEvent(t, contract.PaymentSucceeded, payID, user, 120000, 1)
	second := paymentEvent(t, contract.PaymentSucceeded, payID, user, 120000, 1)
	dupPay0 := metric(t, s.rewardsURL, "rewards_events_total", "result", "duplicate_payment")

	sendMany(t, s.payQ, []events.Envelope{first, second}) // one batch: both in flight together

	c, _ := pipelineOnce(t, payID, 2400)
	var loser uuid.UUID
	switch c.EventID {
	case first.EventID:
		loser = second.EventID
	case second.EventID:
		loser = first.EventID
	default:
		t.Fatalf("credited by event %s, neither of ours", c.EventID)
	}
	eventually(t, 30*time.Second, func() (bool, string) {
		a, b := processed(t, first.EventID), processed(t, second.EventID)
		return a == 1 && b == 1, fmt.Sprintf("dedupe rows: %d and %d, want 1 and 1 (both committed)", a, b)
	})
	eventually(t, 20*time.Second, func() (bool, string) {
		return depth(t, s.payQ) == 0, fmt.Sprintf("payments-events still holds %d messages (not acked)", depth(t, s.payQ))
	})
	if n := len(peek(t, s.payDLQ, withEventID(first.EventID, second.EventID))); n != 0 {
		t.Errorf("%d of the copies were parked, want 0: a duplicate payment is acked, not poison", n)
	}
	if d := metric(t, s.rewardsURL, "rewards_events_total", "result", "duplicate_payment") - dupPay0; d != 1 {
		t.Errorf("rewards_events_total{result=duplicate_payment} rose by %v, want 1", d)
	}
	waitLog(t, "rewards", 1, "payment already credited under another event id", loser.String())
	if b := walletBalance(t, user); b != 2400 {
		t.Errorf("wallet of %s = %d paise, want 2400", user, b)
	}
	if n := count(t, s.notDB, `SELECT count(*) FROM notifications WHERE recipient = $1`, user); n != 1 {
		t.Errorf("%d notifications for %s, want 1", n, user)
	}
}
