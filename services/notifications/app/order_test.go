package app_test

import (
	"strings"
	"testing"
	"time"

	"github.com/effectively-once/payments-cashback/pkg/events"
	"github.com/effectively-once/payments-cashback/services/contract"
)

// Rule 5 in notifications: a CashbackCredited (version 1) that reaches the
// inbox only after its payment's CashbackReversed (version 2) was applied
// (reordered, redelivered after a failed store, redriven from the DLQ)
// changes nothing. The inbox applies such a late row, as it documents; the
// version check is the handler's. Without it the customer is told "It is
// in your wallet" after being told the cashback was reversed.
func TestACreditArrivingAfterItsReversalSendsNoSMS(t *testing.T) {
	t.Parallel()
	s := start(t, nil)
	c := credited(t) // version 1, minted first
	r, err := events.New(contract.CashbackReversed, "pay_42", 2, map[string]any{
		"payment_id": "pay_42", "user_id": "u_17", "amount_paise": 2400, "reason": "payment refunded"})
	if err != nil {
		t.Fatal(err)
	}
	s.send(r)
	eventually(t, 20*time.Second, "the reversal SENT", func() bool {
		ns := s.notifications(r)
		return len(ns) == 1 && ns[0].Status == "SENT"
	})
	s.send(c)
	eventually(t, 10*time.Second, "the late credit acked", func() bool { return s.queueEmpty(s.queue) })
	eventually(t, 10*time.Second, "the late credit processed", func() bool {
		return s.count(`SELECT count(*) FROM inbox WHERE message_id = $1 AND status = 'DONE'`, c.EventID) == 1
	})
	time.Sleep(500 * time.Millisecond) // a sender that had a row to send would have claimed it by now
	for _, d := range s.provider.Deliveries() {
		if strings.Contains(d.Body, "It is in your wallet") {
			t.Errorf("after the reversal SMS, the late CashbackCredited was delivered too: %q", d.Body)
		}
	}
	if n := s.notifications(c); len(n) != 0 {
		t.Errorf("the late credit recorded an SMS intent: %+v", n[0])
	}
	if n := s.notifications(r); len(n) != 1 || n[0].Status != "SENT" {
		t.Errorf("the reversal's notification %+v, want one SENT", n)
	}
	if !strings.Contains(s.logs.String(), "no SMS: its payment was already notified") {
		t.Errorf("the service's log does not say why the late credit sent no SMS")
	}
}
