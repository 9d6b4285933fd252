package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/effectively-once/payments-cashback/services/contract"
)

// Scenario 6. Poison: a malformed body and an event type nobody handles,
// on both queues. Each is parked in its queue's DLQ at once (not retried
// five times) with a park_reason that says why, the alertable counter
// sqs_messages_parked_total{reason} rises by one each, nothing is applied,
// and a good event sent behind the poison flows through.
func TestPoisonMessagesAreParkedWithTheReasonAndTheQueueKeepsFlowing(t *testing.T) {
	marker := id("poison")
	malformed := `{"event_id": "` + marker + `", "event_type": "PaymentSucceeded", ` // cut short
	user, payID := id("u_e2e6"), id("pay_e2e6")
	unknown := paymentEvent(t, "PaymentExploded", payID, user, 120000, 1)
	good := paymentEvent(t, contract.PaymentSucceeded, payID, user, 120000, 1)
	// The same two kinds of poison for notifications, on rewards-events.
	unknownCashback := paymentEvent(t, "CashbackDoubled", payID, user, 2400, 1)

	parked := func(url, queue, reason string) float64 {
		return metric(t, url, "sqs_messages_parked_total", "queue", queue, "reason", reason)
	}
	rwUndecodable0, rwRefused0 := parked(s.rewardsURL, "payments-events", "undecodable"), parked(s.rewardsURL, "payments-events", "refused")
	ntUndecodable0, ntRefused0 := parked(s.notificationsURL, "rewards-events", "undecodable"), parked(s.notificationsURL, "rewards-events", "refused")

	malformedID := sendRaw(t, s.payQ, malformed, map[string]string{"event_type": "PaymentSucceeded"})
	send(t, s.payQ, unknown)
	send(t, s.payQ, good)
	sendRaw(t, s.rewQ, malformed, map[string]string{"event_type": "CashbackCredited"})
	send(t, s.rewQ, unknownCashback)

	// The queue keeps flowing: the good event behind the poison is applied,
	// and its SMS sent.
	pipelineOnce(t, payID, 2400)

	isPoison := func(m types.Message) bool {
		b := aws.ToString(m.Body)
		return strings.Contains(b, marker) || strings.Contains(b, unknown.EventID.String()) || strings.Contains(b, unknownCashback.EventID.String())
	}
	for _, q := range []struct {
		name, dlq       string
		undecodable     string // the reason prefix of each kind
		refused, refuse string
	}{
		{"payments-events", s.payDLQ, "undecodable: events: invalid body", "refused: ", `event type "PaymentExploded"`},
		{"rewards-events", s.rewDLQ, "undecodable: events: invalid body", "refused: ", `event type "CashbackDoubled"`},
	} {
		var got []types.Message
		eventually(t, 30*time.Second, func() (bool, string) {
			got = peek(t, q.dlq, isPoison)
			return len(got) == 2, fmt.Sprintf("%d poison messages in %s-dlq, want 2", len(got), q.name)
		})
		reasons := map[string]string{}
		for _, m := range got {
			kind := "unknown type"
			if strings.Contains(aws.ToString(m.Body), marker) {
				kind = "malformed"
				if aws.ToString(m.Body) != malformed {
					t.Errorf("%s-dlq: the malformed body was changed: %q", q.name, aws.ToString(m.Body))
				}
			}
			reasons[kind] = attr(m, "park_reason")
			if src := attr(m, "park_source_queue"); src != q.name {
				t.Errorf("%s-dlq: park_source_queue %q, want %q", q.name, src, q.name)
			}
		}
		if r := reasons["malformed"]; !strings.HasPrefix(r, q.undecodable) {
			t.Errorf("%s-dlq: malformed body parked with reason %q, want it to start with %q", q.name, r, q.undecodable)
		}
		if r := reasons["unknown type"]; !strings.HasPrefix(r, q.refused) || !strings.Contains(r, q.refuse) {
			t.Errorf("%s-dlq: unknown event type parked with reason %q, want %q...%q", q.name, r, q.refused, q.refuse)
		}
	}

	// The alert: one more parked message per reason on each consumer.
	for _, m := range []struct {
		what        string
		now, before float64
	}{
		{"rewards undecodable", parked(s.rewardsURL, "payments-events", "undecodable"), rwUndecodable0},
		{"rewards refused", parked(s.rewardsURL, "payments-events", "refused"), rwRefused0},
		{"notifications undecodable", parked(s.notificationsURL, "rewards-events", "undecodable"), ntUndecodable0},
		{"notifications refused", parked(s.notificationsURL, "rewards-events", "refused"), ntRefused0},
	} {
		if d := m.now - m.before; d != 1 {
			t.Errorf("sqs_messages_parked_total (%s) rose by %v, want 1", m.what, d)
		}
	}
	// Nothing of the poison was applied or stored.
	if n := processed(t, unknown.EventID); n != 0 {
		t.Errorf("%d dedupe rows for the unknown event type, want 0", n)
	}
	if n := count(t, s.notDB, `SELECT count(*) FROM inbox WHERE message_id = $1`, unknownCashback.EventID); n != 0 {
		t.Errorf("%d inbox rows for the unknown cashback event type, want 0", n)
	}
	if n := count(t, s.notDB, `SELECT count(*) FROM notifications WHERE event_id = $1`, unknownCashback.EventID); n != 0 {
		t.Errorf("%d notifications for the unknown cashback event type, want 0", n)
	}
	if b := walletBalance(t, user); b != 2400 {
		t.Errorf("wallet of %s = %d paise, want 2400 (the good event only)", user, b)
	}
	waitLog(t, "rewards", 1, "undecodable message: parking it", malformedID)
	waitLog(t, "rewards", 1, "payment event refused", unknown.EventID.String())
	// Leave the DLQs as they were.
	take(t, s.payDLQ, isPoison)
	take(t, s.rewDLQ, isPoison)
}
