package e2e

import (
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/effectively-once/payments-cashback/pkg/events"
	"github.com/effectively-once/payments-cashback/services/contract"
)

// paymentState is rewards' payment_versions row.
func paymentState(t testing.TB, payID string) (status string, version int64) {
	t.Helper()
	if err := s.rewDB.QueryRow(bg(), `SELECT status, version FROM payment_versions WHERE payment_id = $1`, payID).Scan(&status, &version); err != nil {
		t.Fatalf("payment_versions %s: %v", payID, err)
	}
	return status, version
}

// Scenario 7. Order: a payment is credited, refunded (cashback reversed),
// and then stale PAID copies arrive: the relay's copy of the original
// PaymentSucceeded, a re-emitted PaymentSucceeded under a new event id,
// and the refund again. The payment stays REFUNDED at version 2 and the
// cashback is reversed exactly once. And when the refund overtakes the
// payment event, the late PAID credits nothing.
func TestStalePaidCopyAfterTheRefundStaysRefundedAndTheCashbackIsReversedOnce(t *testing.T) {
	t.Run("paid, refunded, then stale paid copies", func(t *testing.T) {
		user := id("u_e2e7")
		p := pay(t, user, 120000)
		_, creditedEvent := pipelineOnce(t, p.ID, 2400)

		if r := refund(t, p.ID); r.Status != "REFUNDED" || r.Version != 2 {
			t.Fatalf("refund: %+v, want REFUNDED at version 2", r)
		}
		reversedEvent := outboxEventID(t, s.rewDB, p.ID, contract.CashbackReversed)
		waitSent(t, reversedEvent)
		smsOnce(t, reversedEvent, 1)

		paid := outboxEnvelope(t, s.payDB, outboxEventID(t, s.payDB, p.ID, contract.PaymentSucceeded))
		refunded := outboxEnvelope(t, s.payDB, outboxEventID(t, s.payDB, p.ID, contract.PaymentRefunded))
		reemitted := paid
		reemitted.EventID = uuid.Must(uuid.NewV7()) // same payment, same version 1, another event id
		ignored0 := metric(t, s.rewardsURL, "rewards_events_total", "result", "ignored_after_refund")
		dup0 := metric(t, s.rewardsURL, "idempotent_messages_total", "consumer", "rewards", "outcome", "duplicate")

		sendMany(t, s.payQ, []events.Envelope{paid, refunded})
		eventually(t, 30*time.Second, func() (bool, string) {
			d := metric(t, s.rewardsURL, "idempotent_messages_total", "consumer", "rewards", "outcome", "duplicate") - dup0
			return d == 2, fmt.Sprintf("%v of the 2 redelivered copies seen as duplicates", d)
		})
		send(t, s.payQ, reemitted)
		eventually(t, 30*time.Second, func() (bool, string) {
			return processed(t, reemitted.EventID) == 1, "the re-emitted PaymentSucceeded is not committed"
		})
		waitLog(t, "rewards", 1, "PaymentSucceeded after the payment's refund: stale copy ignored", reemitted.EventID.String())
		if d := metric(t, s.rewardsURL, "rewards_events_total", "result", "ignored_after_refund") - ignored0; d != 1 {
			t.Errorf("rewards_events_total{result=ignored_after_refund} rose by %v, want 1", d)
		}

		if st, v := paymentState(t, p.ID); st != "REFUNDED" || v != 2 {
			t.Errorf("rewards' view of %s: %s v%d, want REFUNDED v2", p.ID, st, v)
		}
		cs := credits(t, "payment_id = $1", p.ID)
		if len(cs) != 1 || cs[0].Status != "REVERSED" || cs[0].AmountPaise != 2400 {
			t.Errorf("credits of %s: %+v, want one of 2400 paise, REVERSED", p.ID, cs)
		}
		if n := count(t, s.rewDB, `SELECT count(*) FROM outbox WHERE aggregate_id = $1 AND event_type = 'CashbackReversed'`, p.ID); n != 1 {
			t.Errorf("%d CashbackReversed for %s, want 1", n, p.ID)
		}
		if n := count(t, s.rewDB, `SELECT count(*) FROM outbox WHERE aggregate_id = $1 AND event_type = 'CashbackCredited'`, p.ID); n != 1 {
			t.Errorf("%d CashbackCredited for %s, want 1", n, p.ID)
		}
		if b := walletBalance(t, user); b != 0 {
			t.Errorf("wallet of %s = %d paise, want 0 (credited 2400, reversed 2400)", user, b)
		}
		if n := count(t, s.notDB, `SELECT count(*) FROM notifications WHERE event_id = ANY($1)`, []uuid.UUID{creditedEvent, reversedEvent}); n != 2 {
			t.Errorf("%d notifications, want 2 (credited, reversed)", n)
		}
		if n := count(t, s.notDB, `SELECT count(*) FROM notifications WHERE recipient = $1`, user); n != 2 {
			t.Errorf("%d notifications for %s, want 2", n, user)
		}
		if code, _, b := do(t, "GET", s.paymentsURL+"/v1/payments/"+p.ID, nil, nil); code != 200 || decode[payment](t, b).Status != "REFUNDED" {
			t.Errorf("GET payment: %d %s, want REFUNDED", code, b)
		}
	})

	t.Run("the refund overtakes the payment event", func(t *testing.T) {
		user, payID := id("u_e2e7b"), id("pay_e2e7b")
		paid := paymentEvent(t, contract.PaymentSucceeded, payID, user, 120000, 1)
		refunded := paymentEvent(t, contract.PaymentRefunded, payID, user, 120000, 2)
		send(t, s.payQ, refunded)
		eventually(t, 30*time.Second, func() (bool, string) {
			return processed(t, refunded.EventID) == 1, "the refund is not committed"
		})
		send(t, s.payQ, paid)
		eventually(t, 30*time.Second, func() (bool, string) {
			return processed(t, paid.EventID) == 1, "the late PaymentSucceeded is not committed"
		})
		waitLog(t, "rewards", 1, "stale copy ignored", paid.EventID.String())
		if st, v := paymentState(t, payID); st != "REFUNDED" || v != 2 {
			t.Errorf("rewards' view of %s: %s v%d, want REFUNDED v2", payID, st, v)
		}
		if cs := credits(t, "payment_id = $1", payID); len(cs) != 0 {
			t.Errorf("credits of %s: %+v, want none", payID, cs)
		}
		if n := count(t, s.rewDB, `SELECT count(*) FROM outbox WHERE aggregate_id = $1`, payID); n != 0 {
			t.Errorf("%d cashback events for %s, want 0", n, payID)
		}
		if b := walletBalance(t, user); b != 0 {
			t.Errorf("wallet of %s = %d paise, want 0", user, b)
		}
	})
}
