package sqstransport_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/effectively-once/payments-cashback/internal/testenv"
	"github.com/effectively-once/payments-cashback/pkg/errs"
	"github.com/effectively-once/payments-cashback/pkg/sqstransport"
)

// A panic that a library below the handler recovered (idempotent.Consumer
// recovers a panicking Effect and returns a *errs.PanicError) is counted as
// the handler's panic: on the MaxPanics-th receive the message is parked
// with reason "panic", as if the panic had reached the subscriber, rather
// than redelivered until SQS dead-letters it without a reason.
func TestARecoveredPanicReturnedAsAnErrorCountsTowardsMaxPanics(t *testing.T) {
	t.Parallel()
	c := testenv.SQS(t)
	q, dlq := testenv.Queue(t, c, 5, 30*time.Second)
	bad, good := newEvent(t, 1), newEvent(t, 2)
	rec := &recorder{then: func(d sqstransport.Delivery, _ int) error {
		if d.Envelope.EventID == bad.EventID {
			return fmt.Errorf("idempotent: effect panicked: %w", &errs.PanicError{Value: "nil map in the cashback rule"})
		}
		return nil
	}}
	cfg := testConfig(q)
	cfg.MaxPanics = 1
	start(t, c, cfg, rec.handle)
	send(t, c, q, bad)
	send(t, c, q, good)

	body, _ := bad.Marshal()
	reasons := dlqReasons(t, c, dlq, 1, 10*time.Second)
	if r, ok := reasons[string(body)]; !ok || !strings.HasPrefix(r, "panic: ") || !strings.Contains(r, "nil map in the cashback rule") {
		t.Fatalf("DLQ park reasons %v; want the message whose effect panicked, with reason \"panic: ...\"", reasons)
	}
	waitEmpty(t, c, q, 5*time.Second)
	if n := counter(t, "sqs_messages_parked_total", queueName(q), "panic"); n != 1 {
		t.Errorf("sqs_messages_parked_total{reason=panic} = %d, want 1", n)
	}
}
