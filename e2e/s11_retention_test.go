package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/effectively-once/payments-cashback/pkg/events"
	"github.com/effectively-once/payments-cashback/services/contract"
)

// Scenario 11. A copy older than the dedupe window (15 days): an event
// that occurred 20 days ago, with the UUIDv7 id a producer would have
// given it then. Its dedupe key may already be forgotten, so applying it
// could apply it twice: it is refused, parked with a reason that names the
// window, counted (idempotent_messages_total{outcome="expired"}) and
// logged, and nothing is credited.
func TestCopyOlderThanTheDedupeWindowIsRefusedParkedCountedAndLogged(t *testing.T) {
	user, payID := id("u_e2e11"), id("pay_e2e11")
	e := paymentEvent(t, contract.PaymentSucceeded, payID, user, 120000, 1)
	then := time.Now().Add(-20 * 24 * time.Hour).UTC().Truncate(time.Millisecond)
	e.EventID, e.OccurredAt = oldEventID(then), then
	if got := events.IDTime(e.EventID); !got.Equal(then) {
		t.Fatalf("crafted event id carries time %v, want %v", got, then)
	}
	expired0 := metric(t, s.rewardsURL, "idempotent_messages_total", "consumer", "rewards", "outcome", "expired")
	refused0 := metric(t, s.rewardsURL, "sqs_messages_parked_total", "queue", "payments-events", "reason", "refused")

	send(t, s.payQ, e)
	var parked []types.Message
	eventually(t, 30*time.Second, func() (bool, string) {
		parked = peek(t, s.payDLQ, withEventID(e.EventID))
		return len(parked) == 1, fmt.Sprintf("%d copies of %s in payments-events-dlq, want 1", len(parked), e.EventID)
	})
	if r := attr(parked[0], "park_reason"); !strings.HasPrefix(r, "refused: ") || !strings.Contains(r, "dedupe window") {
		t.Errorf("park_reason %q, want a refusal naming the dedupe window", r)
	}
	if d := metric(t, s.rewardsURL, "idempotent_messages_total", "consumer", "rewards", "outcome", "expired") - expired0; d != 1 {
		t.Errorf("idempotent_messages_total{outcome=expired} rose by %v, want 1", d)
	}
	if d := metric(t, s.rewardsURL, "sqs_messages_parked_total", "queue", "payments-events", "reason", "refused") - refused0; d != 1 {
		t.Errorf("sqs_messages_parked_total{reason=refused} rose by %v, want 1", d)
	}
	waitLog(t, "rewards", 1, "message older than the dedupe window: refused, not applied", e.EventID.String())
	if n := processed(t, e.EventID); n != 0 {
		t.Errorf("%d dedupe rows for the expired copy, want 0", n)
	}
	if cs := credits(t, "payment_id = $1", payID); len(cs) != 0 {
		t.Errorf("expired copy credited: %+v", cs)
	}
	if b := walletBalance(t, user); b != 0 {
		t.Errorf("wallet of %s = %d paise, want 0", user, b)
	}
	take(t, s.payDLQ, withEventID(e.EventID))
}
