package e2e

import (
	"fmt"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/effectively-once/payments-cashback/services/contract"
)

// Scenario 2. A copy of an event is dead-lettered (its handler fails on
// every delivery until SQS gives up after maxReceiveCount = 5), the
// handler is fixed and another copy of the same event is applied; then the
// project's redrive command moves the dead-lettered copy back. It has a new
// SQS MessageId and the same event_id, so it inserts 0 dedupe rows, is
// logged as a duplicate and acked. One credit, one SMS, nothing left in
// either queue.
func TestDeadLetteredCopyRedrivenWithANewMessageIDIsADuplicateAndIsAcked(t *testing.T) {
	l := local(t)
	user, payID := id("u_e2e2"), id("pay_e2e2")
	e := paymentEvent(t, contract.PaymentSucceeded, payID, user, 120000, 1)
	// The handler fails every attempt at this event, redeliveries 1 s apart.
	restartWith(t, "rewards", "REWARDS_FAIL_EVENT_IDS="+e.EventID.String(),
		"SUBSCRIBER_RETRY_BASE=1s", "SUBSCRIBER_RETRY_MAX=1s")

	sentID := send(t, s.payQ, e)
	var dead []types.Message
	eventually(t, 60*time.Second, func() (bool, string) {
		dead = peek(t, s.payDLQ, withEventID(e.EventID))
		return len(dead) == 1, fmt.Sprintf("%d copies of %s in payments-events-dlq, want 1", len(dead), e.EventID)
	})
	deadID := aws.ToString(dead[0].MessageId)
	if got := attr(dead[0], "event_id"); got != e.EventID.String() {
		t.Errorf("dead-lettered copy has event_id attribute %q, want %s", got, e.EventID)
	}
	// SQS moved it after 5 receives. Each one that reached the handler
	// failed (a receive can also go to a long poll orphaned by a restart,
	// and never reach a handler; it counts towards the 5 all the same).
	failures := metric(t, s.rewardsURL, "rewards_injected_failures_total")
	if failures < 1 || failures > 5 {
		t.Errorf("%v injected failures before the copy was dead-lettered, want 1..5", failures)
	}
	t.Logf("dead-lettered after %v failed attempts", failures)
	// The failed attempts committed nothing, the dedupe key included.
	if n := processed(t, e.EventID); n != 0 {
		t.Fatalf("%d dedupe rows for %s after the failed attempts, want 0", n, e.EventID)
	}
	if cs := credits(t, "payment_id = $1", payID); len(cs) != 0 {
		t.Fatalf("%d credits after the failed attempts, want 0", len(cs))
	}

	// The handler fixed (rewards without the hook), another copy of the
	// same event (a relay resend) is applied.
	restartPlain(t, "rewards")
	resentID := send(t, s.payQ, e)
	waitCredits(t, payID, 1)
	eventually(t, 30*time.Second, func() (bool, string) {
		return depth(t, s.payQ) == 0, fmt.Sprintf("payments-events holds %d messages", depth(t, s.payQ))
	})

	// Redrive with the consumer stopped, to see the redriven copy on the queue.
	if err := l.Stop("rewards"); err != nil {
		t.Fatal(err)
	}
	others := len(peek(t, s.payDLQ, func(m types.Message) bool { return !withEventID(e.EventID)(m) }))
	moved := redrive(t, "-source", "payments-events-dlq")
	if moved != others+1 {
		t.Errorf("redrive moved %d messages, want %d (ours and %d others in the DLQ)", moved, others+1, others)
	}
	var back []types.Message
	eventually(t, 30*time.Second, func() (bool, string) {
		back = peek(t, s.payQ, withEventID(e.EventID))
		return len(back) == 1, fmt.Sprintf("%d copies of %s on payments-events after the redrive, want 1", len(back), e.EventID)
	})
	newID := aws.ToString(back[0].MessageId)
	for _, old := range []string{sentID, resentID, deadID} {
		if newID == old {
			t.Errorf("redriven copy has MessageId %s, the same as an earlier copy; want a new one", newID)
		}
	}
	if got := attr(back[0], "event_id"); got != e.EventID.String() {
		t.Errorf("redriven copy has event_id attribute %q, want %s", got, e.EventID)
	}
	if n := len(peek(t, s.payDLQ, withEventID(e.EventID))); n != 0 {
		t.Errorf("%d copies of %s left in the DLQ, want 0", n, e.EventID)
	}

	// The consumer back: the copy is a duplicate (0 rows), acked, and
	// nothing changes.
	if err := l.Start("rewards"); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, func() (bool, string) {
		d := metric(t, s.rewardsURL, "idempotent_messages_total", "consumer", "rewards", "outcome", "duplicate")
		return d >= 1 && depth(t, s.payQ) == 0, fmt.Sprintf("rewards saw %v duplicates; payments-events holds %d", d, depth(t, s.payQ))
	})
	if others == 0 {
		if d := metric(t, s.rewardsURL, "idempotent_messages_total", "consumer", "rewards", "outcome", "duplicate"); d != 1 {
			t.Errorf("%v duplicates after the redrive, want 1", d)
		}
		if a := metric(t, s.rewardsURL, "idempotent_messages_total", "consumer", "rewards", "outcome", "applied"); a != 0 {
			t.Errorf("%v messages applied after the redrive, want 0", a)
		}
	}
	waitLog(t, "rewards", 1, "duplicate copy acked: already applied", e.EventID.String())
	if n := processed(t, e.EventID); n != 1 {
		t.Errorf("%d dedupe rows for %s, want 1", n, e.EventID)
	}
	pipelineOnce(t, payID, 2400)
	if b := walletBalance(t, user); b != 2400 {
		t.Errorf("wallet of %s = %d paise, want 2400", user, b)
	}
}
