package e2e

import (
	"fmt"
	"testing"
	"time"

	"github.com/effectively-once/payments-cashback/services/contract"
)

// Scenario 9. The SMS provider accepts the message and then hangs; the
// sender's call times out (outcome unknown) and the process is killed at
// the in-sending failpoint, leaving the row SENDING. After the restart the
// reconciler takes the row over when its lease expires, asks the provider
// under the same key sms:<event_id>, finds it delivered and marks it SENT
// without sending again: one SMS delivered, one request seen (at most two
// allowed), one notification. The crash point is aimed at this user's SMS:
// another user's, waiting on the queue when the sender starts, is sent
// once and does not set it off.
func TestSenderKilledInSendingAfterTheProviderAcceptedDeliversExactlyOneSMS(t *testing.T) {
	l := local(t)
	knobs := []string{"SMS_PROVIDER_TIMEOUT=1s", "SENDING_LEASE=3s"}
	user := id("u_e2e9")
	// Another user's SMS waits on the queue and is sent first: the crash
	// point is aimed at this user's, so it must not fire on that one.
	if err := l.Stop("notifications"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { restartPlain(t, "notifications") })
	other := pay(t, id("u_e2e9other"), 50000)
	waitCredits(t, other.ID, 1)
	otherCE := outboxEventID(t, s.rewDB, other.ID, contract.CashbackCredited)
	eventually(t, 30*time.Second, func() (bool, string) {
		n := count(t, s.rewDB, `SELECT count(*) FROM outbox WHERE id = $1 AND published_at IS NOT NULL`, otherCE)
		return n == 1, fmt.Sprintf("CashbackCredited %s not published yet", otherCE)
	})
	if err := l.Start("notifications", append(knobs, "FAILPOINTS=in-sending="+user)...); err != nil {
		t.Fatal(err)
	}
	// Aimed at this user's SMS: another scenario's, still in flight, must
	// not spend the hang.
	smsControl(t, map[string]any{"hang_ms": 5000, "hang_next": 1, "hang_after_accept": true, "to": user})
	t.Cleanup(func() { smsControl(t, map[string]any{"hang_next": 0, "to": ""}) })

	p := pay(t, user, 120000)
	waitCredits(t, p.ID, 1)
	ce := outboxEventID(t, s.rewDB, p.ID, contract.CashbackCredited)

	killed, err := l.WaitExit("notifications", 60*time.Second)
	if err != nil || !killed {
		t.Fatalf("notifications: killed by a signal = %v, err = %v; want SIGKILL at in-sending", killed, err)
	}
	n, ok := notificationOf(t, ce)
	if !ok || n.Status != "SENDING" || n.Attempts != 1 {
		t.Fatalf("after the crash the notification is %+v (found %v), want SENDING after 1 attempt", n, ok)
	}
	d := smsOnce(t, ce, 1) // the provider delivered it before hanging
	if n.Key != "sms:"+ce.String() {
		t.Errorf("idempotency key %q, want sms:%s", n.Key, ce)
	}

	if err := l.Start("notifications", knobs...); err != nil {
		t.Fatal(err)
	}
	sent := waitSent(t, ce)
	waitSent(t, otherCE)
	smsOnce(t, otherCE, 1)
	if sent.ProviderMessageID == nil || *sent.ProviderMessageID != d.MessageID {
		t.Errorf("SENT with provider message id %v, want %s (the one delivered before the crash)", sent.ProviderMessageID, d.MessageID)
	}
	if sent.Attempts != 1 {
		t.Errorf("%d provider calls recorded, want 1 (reconciled by lookup, not resent)", sent.Attempts)
	}
	ds := deliveries(t, "sms:"+ce.String())
	if len(ds) != 1 || ds[0].Requests > 2 {
		t.Fatalf("provider: %+v; want one delivery after at most 2 requests", ds)
	}
	if ds[0].Requests != 1 {
		t.Errorf("provider saw %d requests under the key, want 1 (the lookup found it)", ds[0].Requests)
	}
	eventually(t, 10*time.Second, func() (bool, string) {
		m := metric(t, s.notificationsURL, "notifications_reconciled_total", "how", "lookup_found")
		return m == 1, fmt.Sprintf("notifications_reconciled_total{how=lookup_found} = %v, want 1", m)
	})
	if c := count(t, s.notDB, `SELECT count(*) FROM notifications WHERE recipient = $1`, user); c != 1 {
		t.Errorf("%d notifications for %s, want 1", c, user)
	}
}
