package e2e

import (
	"fmt"
	"testing"
	"time"

	"github.com/effectively-once/payments-cashback/services/contract"
)

// Scenario 1. The relay publishes PaymentSucceeded (the story's e-91) and
// is SIGKILLed before it marks the outbox row published; restarted, it
// publishes the row again. Rewards gets two copies of one event id and
// applies one: one credit, one CashbackCredited, one SMS.
func TestRelayKilledAfterPublishBeforeMarkPublishesAgainAndTheEventIsAppliedOnce(t *testing.T) {
	l := local(t)
	// Payments without its in-process relay, and a relay process of its own
	// armed to SIGKILL itself right after its first publish.
	restartWith(t, "payments", "RELAY_ENABLED=false")
	relay := []string{"ROLE=relay", "RELAY_LEASE=2s", "RELAY_POLL_INTERVAL=100ms"}
	if err := l.StartAs("payments-relay", "payments", append(relay, "FAILPOINTS=after-publish-before-mark")...); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Stop("payments-relay") })
	dup0 := metric(t, s.rewardsURL, "idempotent_messages_total", "consumer", "rewards", "outcome", "duplicate")
	app0 := metric(t, s.rewardsURL, "idempotent_messages_total", "consumer", "rewards", "outcome", "applied")

	user := id("u_e2e1")
	p := pay(t, user, 120000)
	e91 := outboxEventID(t, s.payDB, p.ID, contract.PaymentSucceeded)

	killed, err := l.WaitExit("payments-relay", 30*time.Second)
	if err != nil || !killed {
		t.Fatalf("relay: killed by a signal = %v, err = %v; want SIGKILL at after-publish-before-mark", killed, err)
	}
	var published *time.Time
	var attempts int
	row := func() {
		if err := s.payDB.QueryRow(bg(), `SELECT published_at, attempts FROM outbox WHERE id = $1`, e91).Scan(&published, &attempts); err != nil {
			t.Fatal(err)
		}
	}
	row()
	// The claim was the killed relay's open transaction: it died with the
	// process and left nothing, so the row is as before the claim.
	if published != nil || attempts != 0 {
		t.Fatalf("after the crash the outbox row is published_at=%v attempts=%d; want unmarked and no attempt recorded", published, attempts)
	}
	// The first copy is already on the queue: it is applied while the relay is down.
	waitCredits(t, p.ID, 1)

	// Restarted and unarmed, the relay claims the row at once (its row
	// lock died with the killed process's session) and publishes the
	// second copy.
	if err := l.Start("payments-relay", "FAILPOINTS="); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, func() (bool, string) {
		row()
		return published != nil, fmt.Sprintf("outbox row %s not marked published (attempts %d)", e91, attempts)
	})
	if attempts != 1 {
		t.Errorf("outbox row %s marked after %d recorded attempts, want 1 (the send after the restart)", e91, attempts)
	}
	eventually(t, 30*time.Second, func() (bool, string) {
		d := metric(t, s.rewardsURL, "idempotent_messages_total", "consumer", "rewards", "outcome", "duplicate") - dup0
		return d == 1, fmt.Sprintf("rewards saw %v duplicate copies, want 1 (the resend)", d)
	})
	if a := metric(t, s.rewardsURL, "idempotent_messages_total", "consumer", "rewards", "outcome", "applied") - app0; a != 1 {
		t.Errorf("rewards applied %v messages, want 1", a)
	}

	c, _ := pipelineOnce(t, p.ID, 2400)
	if c.EventID != e91 {
		t.Errorf("credited by event %s, want %s", c.EventID, e91)
	}
	if n := processed(t, e91); n != 1 {
		t.Errorf("%d dedupe rows for %s, want 1", n, e91)
	}
	if b := walletBalance(t, user); b != 2400 {
		t.Errorf("wallet of %s = %d paise, want 2400", user, b)
	}
}
