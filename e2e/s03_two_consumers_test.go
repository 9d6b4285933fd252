package e2e

import (
	"fmt"
	"testing"
	"time"

	"github.com/effectively-once/payments-cashback/services/contract"
)

// Scenario 3. A second copy of a message reaches a second replica while the
// first is still inside its transaction (a relay resend; a copy made
// visible again by its visibility timeout cannot, since a handler's
// deadline is below that timeout). The second replica's dedupe INSERT waits
// on the first one's uncommitted key, then inserts 0 rows: exactly one
// credit, one applied, one duplicate.
func TestSecondReplicaGetsTheMessageWhileTheFirstStillHoldsItAndOnlyOneCredits(t *testing.T) {
	l := local(t)
	user, payID := id("u_e2e3"), id("pay_e2e3")
	e := paymentEvent(t, contract.PaymentSucceeded, payID, user, 120000, 1)
	knobs := []string{"REWARDS_SLOW_EVENT_IDS=" + e.EventID.String() + "@10s",
		"SUBSCRIBER_VISIBILITY=30s", // a handler deadline of 24 s, above the 10 s hold
		"CONSUMER_CONCURRENCY=1"}    // a busy replica cannot take the copy itself
	restartWith(t, "rewards", knobs...)

	send(t, s.payQ, e)
	// Replica 1 is inside the transaction (dedupe row and credit written, not committed).
	waitLog(t, "rewards", 1, "test hook: holding the transaction open", e.EventID.String())

	if err := l.StartAs("rewards-2", "rewards", knobs...); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Stop("rewards-2") })
	send(t, s.payQ, e) // the second copy, same body and event_id
	// Replica 2 received the copy and is blocked on the same dedupe key.
	eventually(t, 20*time.Second, func() (bool, string) {
		n := count(t, s.rewDB, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
			AND wait_event_type = 'Lock' AND query LIKE 'INSERT INTO processed_messages%'`)
		return n == 1, fmt.Sprintf("%d sessions waiting on a processed_messages key, want 1 (the second replica)", n)
	})
	if c := credits(t, "payment_id = $1", payID); len(c) != 0 {
		t.Fatalf("credit visible before the first replica committed: %+v", c)
	}

	pipelineOnce(t, payID, 2400)
	// Replica 2's own copy also outlives its visibility while it waits, so
	// the server may hand the message out again, to either replica, before
	// the deletes land: moto does (replica 2 received it twice and acked
	// two duplicates), fauxqs in this timing does not. However many extra
	// copies there are, each is a duplicate and only replica 1 applies.
	eventually(t, 30*time.Second, func() (bool, string) {
		a1 := metric(t, s.rewardsURL, "idempotent_messages_total", "consumer", "rewards", "outcome", "applied")
		d2 := metric(t, l.URL("rewards-2"), "idempotent_messages_total", "consumer", "rewards", "outcome", "duplicate")
		return a1 == 1 && d2 >= 1, fmt.Sprintf("replica 1 applied %v, replica 2 saw %v duplicates; want 1 and at least 1", a1, d2)
	})
	if a2 := metric(t, l.URL("rewards-2"), "idempotent_messages_total", "consumer", "rewards", "outcome", "applied"); a2 != 0 {
		t.Errorf("replica 2 applied %v messages, want 0", a2)
	}
	if n := processed(t, e.EventID); n != 1 {
		t.Errorf("%d dedupe rows for %s, want 1", n, e.EventID)
	}
	if b := walletBalance(t, user); b != 2400 {
		t.Errorf("wallet of %s = %d paise, want 2400", user, b)
	}
	eventually(t, 20*time.Second, func() (bool, string) {
		return depth(t, s.payQ) == 0, fmt.Sprintf("payments-events still holds %d messages", depth(t, s.payQ))
	})
}
