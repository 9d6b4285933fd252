package sqstransport_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"go.opentelemetry.io/otel/trace"

	"github.com/effectively-once/payments-cashback/internal/testenv"
	"github.com/effectively-once/payments-cashback/pkg/events"
	"github.com/effectively-once/payments-cashback/pkg/sqstransport"
)

// A batch subscriber hands a whole receive to its handler: 12 messages sent
// at once arrive as receives of up to 10 (never one by one), the
// undecodable one is parked before the handler sees the rest, and each
// message is settled on its own result: nil deleted, permanent parked,
// transient left for redelivery (and handed over again later). Each
// delivery carries its own trace (the one its traceparent names).
func TestBatchSubscriberHandsWholeReceivesAndSettlesEachMessage(t *testing.T) {
	t.Parallel()
	c := testenv.SQS(t)
	q, dlq := testenv.Queue(t, c, 5, 30*time.Second)
	var evs []events.Envelope
	for i := range 11 {
		evs = append(evs, newEvent(t, i))
	}
	poison, flaky := evs[3], evs[7]
	entries := func(es []events.Envelope) []types.SendMessageBatchRequestEntry {
		var out []types.SendMessageBatchRequestEntry
		for i, e := range es {
			b, _ := e.Marshal()
			tp := fmt.Sprintf("00-4bf92f3577b34da6a3ce929d0e0e47%02d-00f067aa0ba902b7-01", i)
			out = append(out, types.SendMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), MessageBody: aws.String(string(b)),
				MessageAttributes: map[string]types.MessageAttributeValue{"traceparent": {DataType: aws.String("String"), StringValue: aws.String(tp)}}})
		}
		return out
	}
	for _, es := range [][]events.Envelope{evs[:10], evs[10:]} {
		if _, err := c.SendMessageBatch(context.Background(), &sqs.SendMessageBatchInput{QueueUrl: aws.String(q), Entries: entries(es)}); err != nil {
			t.Fatal(err)
		}
	}
	sendRaw(t, c, q, `{"event_id": "not json`, nil)

	var mu sync.Mutex
	var sizes []int
	seen := map[string]int{}
	flakyFailed := false
	h := func(ctx context.Context, ds []sqstransport.Delivery) []error {
		mu.Lock()
		defer mu.Unlock()
		sizes = append(sizes, len(ds))
		errs := make([]error, len(ds))
		for i, d := range ds {
			seen[d.Envelope.EventID.String()]++
			if sc := trace.SpanContextFromContext(d.Ctx); !sc.IsValid() || sc.TraceID().String() != d.Attributes["traceparent"][3:35] {
				errs[i] = fmt.Errorf("delivery %s has no span of its own", d.Envelope.EventID)
			}
			switch d.Envelope.EventID {
			case poison.EventID:
				errs[i] = sqstransport.Permanent(errors.New("poison"))
			case flaky.EventID:
				if !flakyFailed {
					flakyFailed = true
					errs[i] = errors.New("transient")
				}
			}
		}
		return errs
	}
	cfg := testConfig(q)
	cfg.Concurrency = 1
	runBatch(t, c, cfg, h)
	waitFor(t, 20*time.Second, "every message settled", func() bool {
		v, i := depth(t, c, q)
		mu.Lock()
		defer mu.Unlock()
		return v == 0 && i == 0 && seen[flaky.EventID.String()] == 2
	})
	mu.Lock()
	defer mu.Unlock()
	for _, e := range evs {
		want := 1
		if e.EventID == flaky.EventID {
			want = 2
		}
		if seen[e.EventID.String()] != want {
			t.Errorf("event %s handed over %d times, want %d", e.EventID, seen[e.EventID.String()], want)
		}
	}
	if sizes[0] < 2 {
		t.Errorf("first receive handed %d messages; a batch subscriber asks for 10 (sizes %v)", sizes[0], sizes)
	}
	for _, n := range sizes {
		if n > 10 {
			t.Errorf("a batch of %d, more than a receive holds", n)
		}
	}
	visible, _ := depth(t, c, dlq)
	if visible != 2 {
		t.Errorf("DLQ holds %d, want 2 (the undecodable and the poison)", visible)
	}
}

// A batch handler that panics does not stop the subscriber: the receive's
// messages fail like a handler error (nothing deleted), come back, and are
// deleted once a later call succeeds.
func TestBatchHandlerPanicLeavesTheReceiveForRedelivery(t *testing.T) {
	t.Parallel()
	c := testenv.SQS(t)
	q, _ := testenv.Queue(t, c, 5, 30*time.Second)
	e := newEvent(t, 1)
	send(t, c, q, e)
	var mu sync.Mutex
	calls := 0
	h := func(ctx context.Context, ds []sqstransport.Delivery) []error {
		mu.Lock()
		calls++
		n := calls
		mu.Unlock()
		if n == 1 {
			panic("boom")
		}
		return make([]error, len(ds))
	}
	cfg := testConfig(q)
	runBatch(t, c, cfg, h)
	// The redelivery first: a server's approximate counts may pass
	// through 0 visible, 0 in flight as the visibility runs out.
	waitFor(t, 20*time.Second, "the redelivery handled", func() bool { mu.Lock(); defer mu.Unlock(); return calls >= 2 })
	waitEmpty(t, c, q, 20*time.Second)
	mu.Lock()
	defer mu.Unlock()
	if calls != 2 {
		t.Errorf("handler called %d times, want 2 (the panic, then the redelivery)", calls)
	}
}

// HandlerTimeout reaches each delivery's own context, the one a batch
// handler runs each message's effect with (idempotent.Item.Ctx): a hung
// effect is cut at the deadline, not left holding its dedupe key and a
// connection while the heartbeat keeps the message invisible.
func TestBatchHandlerTimeoutReachesEachDeliverysContext(t *testing.T) {
	t.Parallel()
	c := testenv.SQS(t)
	q, _ := testenv.Queue(t, c, 5, 30*time.Second)
	send(t, c, q, newEvent(t, 1))
	cut := make(chan time.Duration, 1)
	h := func(ctx context.Context, ds []sqstransport.Delivery) []error {
		t0 := time.Now()
		select {
		case <-ds[0].Ctx.Done(): // the effect waits on its delivery's context
		case <-time.After(12 * time.Second):
		}
		select {
		case cut <- time.Since(t0):
		default:
		}
		out := make([]error, len(ds))
		for i := range out {
			out[i] = ds[0].Ctx.Err()
		}
		return out
	}
	cfg := testConfig(q) // Visibility 5s: the default deadline is 4s
	runBatch(t, c, cfg, h)
	select {
	case d := <-cut:
		if d >= cfg.Visibility {
			t.Errorf("the hung effect ran %v, want it cut at the handler deadline (about 4s, below the 5s visibility)", d)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the batch handler was never called")
	}
}

// runBatch runs a batch subscriber with h until the test ends; Run must
// then return nil.
func runBatch(t *testing.T, c *sqs.Client, cfg sqstransport.SubscriberConfig, h sqstransport.BatchHandler) {
	t.Helper()
	s, err := sqstransport.NewBatchSubscriber(c, cfg, h)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
}
