package sqstransport_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/aws/smithy-go/middleware"
	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/effectively-once/payments-cashback/internal/testenv"
	"github.com/effectively-once/payments-cashback/pkg/events"
	"github.com/effectively-once/payments-cashback/pkg/failpoint"
	"github.com/effectively-once/payments-cashback/pkg/idempotent"
	"github.com/effectively-once/payments-cashback/pkg/sqstransport"
)

// metrics is the global MeterProvider's reader for this test binary; the
// Subscriber's counters (created through otel.Meter) report to it.
var metrics = sdkmetric.NewManualReader()

func init() {
	otel.SetMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(metrics)))
}

// counter sums the int64 counter name over the data points whose "queue"
// attribute is queue and, if reason is not empty, whose "reason" is reason.
func counter(t testing.TB, name, queue, reason string) int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := metrics.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != name {
				continue
			}
			sum, ok := m.Data.(metricdata.Sum[int64])
			if !ok {
				t.Fatalf("%s is a %T, want a Sum[int64]", name, m.Data)
			}
			for _, dp := range sum.DataPoints {
				q, _ := dp.Attributes.Value(attribute.Key("queue"))
				r, _ := dp.Attributes.Value(attribute.Key("reason"))
				if q.AsString() == queue && (reason == "" || r.AsString() == reason) {
					n += dp.Value
				}
			}
		}
	}
	return n
}

func queueName(u string) string { return u[strings.LastIndex(u, "/")+1:] }

func newEvent(t testing.TB, i int) events.Envelope {
	t.Helper()
	e, err := events.New("PaymentSucceeded", fmt.Sprintf("pay_%d", i), 1, map[string]any{"amount_paise": 120000 + i})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func sendRaw(t testing.TB, c *sqs.Client, q, body string, attrs map[string]string) {
	t.Helper()
	ma := map[string]types.MessageAttributeValue{}
	for k, v := range attrs {
		ma[k] = types.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(v)}
	}
	if _, err := c.SendMessage(context.Background(), &sqs.SendMessageInput{QueueUrl: aws.String(q), MessageBody: aws.String(body), MessageAttributes: ma}); err != nil {
		t.Fatal(err)
	}
}

func send(t testing.TB, c *sqs.Client, q string, e events.Envelope) {
	t.Helper()
	body, err := e.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	sendRaw(t, c, q, string(body), map[string]string{"event_id": e.EventID.String(), "event_type": e.EventType})
}

// sendTogether sends evs in one SendMessageBatch, so that a batch
// subscriber's first receive normally holds them all.
func sendTogether(t testing.TB, c *sqs.Client, q string, evs ...events.Envelope) {
	t.Helper()
	entries := make([]types.SendMessageBatchRequestEntry, len(evs))
	for i, e := range evs {
		b, err := e.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		entries[i] = types.SendMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), MessageBody: aws.String(string(b))}
	}
	if _, err := c.SendMessageBatch(context.Background(), &sqs.SendMessageBatchInput{QueueUrl: aws.String(q), Entries: entries}); err != nil {
		t.Fatal(err)
	}
}

// depth is what SQS reports: messages visible, and received but not deleted.
func depth(t testing.TB, c *sqs.Client, q string) (visible, inflight int) {
	t.Helper()
	out, err := c.GetQueueAttributes(context.Background(), &sqs.GetQueueAttributesInput{QueueUrl: aws.String(q),
		AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameApproximateNumberOfMessages, types.QueueAttributeNameApproximateNumberOfMessagesNotVisible}})
	if err != nil {
		t.Fatal(err)
	}
	visible, _ = strconv.Atoi(out.Attributes[string(types.QueueAttributeNameApproximateNumberOfMessages)])
	inflight, _ = strconv.Atoi(out.Attributes[string(types.QueueAttributeNameApproximateNumberOfMessagesNotVisible)])
	return visible, inflight
}

func waitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func waitEmpty(t testing.TB, c *sqs.Client, q string, timeout time.Duration) {
	t.Helper()
	waitFor(t, timeout, "the queue to be empty", func() bool { v, i := depth(t, c, q); return v == 0 && i == 0 })
}

// running is a Subscriber whose Run was started in the background.
type running struct {
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
	err    error
}

// stop cancels Run and waits for it (at most limit), returning its error.
func (r *running) stop(t testing.TB, limit time.Duration) error {
	t.Helper()
	r.once.Do(func() {
		r.cancel()
		select {
		case r.err = <-r.done:
		case <-time.After(limit):
			r.err = fmt.Errorf("Run did not return within %v of cancel", limit)
		}
	})
	return r.err
}

// testConfig is a SubscriberConfig for tests: a short long-poll wait, so
// that a poll abandoned at shutdown (which the server still answers, making
// a message invisible, as real SQS may) ends quickly.
func testConfig(q string) sqstransport.SubscriberConfig {
	return sqstransport.SubscriberConfig{QueueURL: q, WaitTime: time.Second, Visibility: 5 * time.Second, RetryBase: time.Second}
}

func start(t testing.TB, c *sqs.Client, cfg sqstransport.SubscriberConfig, h sqstransport.Handler) *running {
	t.Helper()
	s, err := sqstransport.NewSubscriber(c, cfg, h)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- s.Run(ctx) }()
	t.Cleanup(func() {
		if err := r.stop(t, 60*time.Second); err != nil {
			t.Errorf("Subscriber.Run: %v", err)
		}
	})
	return r
}

// recorder is a handler that records deliveries.
type recorder struct {
	mu   sync.Mutex
	got  []sqstransport.Delivery
	then func(d sqstransport.Delivery, n int) error // n: 1-based delivery number
}

func (r *recorder) handle(ctx context.Context, d sqstransport.Delivery) error {
	r.mu.Lock()
	r.got = append(r.got, d)
	n := len(r.got)
	r.mu.Unlock()
	if r.then != nil {
		return r.then(d, n)
	}
	return nil
}

func (r *recorder) deliveries() []sqstransport.Delivery {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]sqstransport.Delivery(nil), r.got...)
}

// The message stays in the queue (in flight) while its handler runs and is
// deleted only once the handler returned nil.
func TestDeletesOnlyAfterHandlerReturnsNil(t *testing.T) {
	t.Parallel()
	c := testenv.SQS(t)
	q, _ := testenv.Queue(t, c, 5, 30*time.Second)
	entered, release := make(chan struct{}), make(chan struct{})
	rec := &recorder{then: func(sqstransport.Delivery, int) error { close(entered); <-release; return nil }}
	start(t, c, testConfig(q), rec.handle)
	e := newEvent(t, 1)
	send(t, c, q, e)

	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("handler never called")
	}
	time.Sleep(300 * time.Millisecond)
	if v, i := depth(t, c, q); v != 0 || i != 1 {
		t.Fatalf("while the handler runs: %d visible, %d in flight; want 0, 1 (not deleted)", v, i)
	}
	close(release)
	waitEmpty(t, c, q, 5*time.Second)

	d := rec.deliveries()
	if len(d) != 1 {
		t.Fatalf("%d deliveries, want 1", len(d))
	}
	got := d[0]
	if got.Envelope.EventID != e.EventID || got.Envelope.EventType != e.EventType || !got.Envelope.OccurredAt.Equal(e.OccurredAt) ||
		string(got.Envelope.Payload) != string(e.Payload) {
		t.Errorf("envelope %+v, want %+v", got.Envelope, e)
	}
	if got.SQSMessageID == "" || got.ReceiveCount != 1 || got.Attributes["event_id"] != e.EventID.String() {
		t.Errorf("delivery: message id %q, receive count %d, attributes %v", got.SQSMessageID, got.ReceiveCount, got.Attributes)
	}
	waitFor(t, 2*time.Second, "sqs_messages_deleted_total = 1", func() bool {
		return counter(t, "sqs_messages_deleted_total", queueName(q), "") == 1
	})
	if n := counter(t, "sqs_messages_received_total", queueName(q), ""); n != 1 {
		t.Errorf("sqs_messages_received_total = %d, want 1", n)
	}
}

// A handler error leaves the message in the queue; it comes back after the
// backoff (RetryBase, far shorter than the queue's 30 s visibility timeout)
// with receive count 2, and is deleted once handled.
func TestHandlerErrorLeavesMessageForRedelivery(t *testing.T) {
	t.Parallel()
	c := testenv.SQS(t)
	q, _ := testenv.Queue(t, c, 5, 30*time.Second)
	var at []time.Time
	rec := &recorder{then: func(_ sqstransport.Delivery, n int) error {
		at = append(at, time.Now())
		if n == 1 {
			return errors.New("database unavailable")
		}
		return nil
	}}
	cfg := testConfig(q)
	cfg.Visibility = 30 * time.Second
	start(t, c, cfg, rec.handle)
	send(t, c, q, newEvent(t, 1))

	waitFor(t, 15*time.Second, "the redelivery", func() bool { return len(rec.deliveries()) == 2 })
	waitEmpty(t, c, q, 5*time.Second)
	d := rec.deliveries()
	if d[0].ReceiveCount != 1 || d[1].ReceiveCount != 2 || d[0].SQSMessageID != d[1].SQSMessageID {
		t.Fatalf("deliveries: receive counts %d, %d, ids %s, %s; want 1, 2 of the same message",
			d[0].ReceiveCount, d[1].ReceiveCount, d[0].SQSMessageID, d[1].SQSMessageID)
	}
	if gap := at[1].Sub(at[0]); gap < 900*time.Millisecond || gap > 10*time.Second {
		t.Errorf("redelivered after %v, want about RetryBase (1s), not the 30 s visibility timeout", gap)
	}
	if n := counter(t, "sqs_handler_errors_total", queueName(q), ""); n != 1 {
		t.Errorf("sqs_handler_errors_total = %d, want 1", n)
	}
	time.Sleep(1500 * time.Millisecond)
	if n := len(rec.deliveries()); n != 2 {
		t.Fatalf("%d deliveries after the successful one, want no more than 2", n)
	}
}

// Poison (a malformed body, an unknown top-level field, a Permanent
// handler error) is parked in the DLQ at once with a park_reason, the
// parked metric rises, and the queue keeps flowing behind it.
func TestPoisonIsParkedAndTheQueueKeepsFlowing(t *testing.T) {
	t.Parallel()
	c := testenv.SQS(t)
	q, dlq := testenv.Queue(t, c, 5, 30*time.Second)
	refused, good := newEvent(t, 1), newEvent(t, 2)
	unknown := newEvent(t, 3)
	ub, _ := unknown.Marshal()
	bodies := map[string]string{
		"malformed": `{"event_id": "01890a5d-ac96-774b-bcce-b302099a8057", "event_type": `,
		"unknown":   strings.TrimSuffix(string(ub), "}") + `,"priority":"high"}`,
	}
	rb, _ := refused.Marshal()
	bodies["refused"] = string(rb)

	rec := &recorder{then: func(d sqstransport.Delivery, _ int) error {
		if d.Envelope.EventID == refused.EventID {
			return sqstransport.Permanent(fmt.Errorf("payment %s: unknown currency XXX", d.Envelope.AggregateID))
		}
		return nil
	}}
	cfg := testConfig(q)
	cfg.Concurrency = 1
	start(t, c, cfg, rec.handle)
	sendRaw(t, c, q, bodies["malformed"], map[string]string{"event_type": "PaymentSucceeded"})
	sendRaw(t, c, q, bodies["unknown"], map[string]string{"event_id": unknown.EventID.String()})
	send(t, c, q, refused)
	send(t, c, q, good)

	waitFor(t, 15*time.Second, "the good message behind the poison", func() bool {
		for _, d := range rec.deliveries() {
			if d.Envelope.EventID == good.EventID {
				return true
			}
		}
		return false
	})
	waitEmpty(t, c, q, 5*time.Second)
	if n := len(rec.deliveries()); n != 2 {
		t.Errorf("handler called %d times, want 2 (the refused and the good event; undecodable bodies never reach it)", n)
	}

	// The DLQ holds the three, each with the reason and where it came from.
	parked := map[string]types.Message{}
	for deadline := time.Now().Add(10 * time.Second); len(parked) < 3 && time.Now().Before(deadline); {
		out, err := c.ReceiveMessage(context.Background(), &sqs.ReceiveMessageInput{QueueUrl: aws.String(dlq),
			MaxNumberOfMessages: 10, WaitTimeSeconds: 1, MessageAttributeNames: []string{"All"}})
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range out.Messages {
			for kind, b := range bodies {
				if aws.ToString(m.Body) == b {
					parked[kind] = m
				}
			}
		}
	}
	if len(parked) != 3 {
		t.Fatalf("DLQ holds %d of the 3 poison messages", len(parked))
	}
	attr := func(m types.Message, k string) string { return aws.ToString(m.MessageAttributes[k].StringValue) }
	for kind, prefix := range map[string]string{"malformed": "undecodable: ", "unknown": "undecodable: ", "refused": "refused: "} {
		m := parked[kind]
		if r := attr(m, "park_reason"); !strings.HasPrefix(r, prefix) {
			t.Errorf("%s: park_reason %q, want prefix %q", kind, r, prefix)
		}
		if s := attr(m, "park_source_queue"); s != queueName(q) {
			t.Errorf("%s: park_source_queue %q, want %q", kind, s, queueName(q))
		}
		if attr(m, "park_source_message_id") == "" {
			t.Errorf("%s: no park_source_message_id", kind)
		}
	}
	if r := attr(parked["unknown"], "park_reason"); !strings.Contains(r, "priority") {
		t.Errorf("park_reason %q does not name the unknown field", r)
	}
	if r := attr(parked["refused"], "park_reason"); !strings.Contains(r, "unknown currency XXX") {
		t.Errorf("park_reason %q does not carry the handler's error", r)
	}
	if id := attr(parked["refused"], "event_id"); id != refused.EventID.String() {
		t.Errorf("parked copy lost the original attributes: event_id %q", id)
	}

	name := queueName(q)
	if n := counter(t, "sqs_messages_parked_total", name, ""); n != 3 {
		t.Errorf("sqs_messages_parked_total = %d, want 3", n)
	}
	if u, r := counter(t, "sqs_messages_parked_total", name, "undecodable"), counter(t, "sqs_messages_parked_total", name, "refused"); u != 2 || r != 1 {
		t.Errorf("parked by reason: undecodable %d, refused %d; want 2, 1", u, r)
	}
}

// While a handler runs longer than the visibility timeout, the subscriber
// keeps extending it: a second subscriber on the same queue never sees a
// copy. The control shows the test can see one when extension stops.
func TestVisibilityIsExtendedWhileTheHandlerRuns(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name         string
		maxExtension time.Duration
		wantSecond   bool
	}{
		{"extended", 0, false},
		{"control: MaxExtension exceeded", time.Millisecond, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := testenv.SQS(t)
			q, _ := testenv.Queue(t, c, 5, 2*time.Second)
			// Both subscribers may receive a copy; only the first
			// delivery is slow.
			entered := make(chan struct{})
			var finished atomic.Bool
			var deliveries atomic.Int64
			slow := func(sqstransport.Delivery, int) error {
				if deliveries.Add(1) == 1 {
					close(entered)
					time.Sleep(5 * time.Second)
					finished.Store(true)
				}
				return nil
			}
			first, second := &recorder{then: slow}, &recorder{then: slow}
			cfg := testConfig(q)
			cfg.Visibility, cfg.MaxExtension = 2*time.Second, tc.maxExtension
			start(t, c, cfg, first.handle)
			send(t, c, q, newEvent(t, 1))
			select {
			case <-entered:
			case <-time.After(10 * time.Second):
				t.Fatal("handler never called")
			}
			start(t, c, cfg, second.handle)

			waitFor(t, 10*time.Second, "the slow handler", finished.Load)
			if tc.wantSecond {
				if n := deliveries.Load(); n < 2 {
					t.Fatalf("control: %d deliveries, want a second copy while the first handler ran (else the test could not see a race)", n)
				}
				return
			}
			waitEmpty(t, c, q, 5*time.Second)
			time.Sleep(3 * time.Second) // past another visibility timeout
			if n := len(second.deliveries()); n != 0 {
				t.Fatalf("the second subscriber got %d copies while the first was handling it", n)
			}
			if n := len(first.deliveries()); n != 1 {
				t.Fatalf("the first subscriber got %d deliveries, want 1", n)
			}
		})
	}
}

// Cancelling Run while a handler runs: receiving stops, the handler
// finishes, its message is deleted, then Run returns nil. A handler that
// fails during shutdown leaves its message in the queue; one still running
// when ShutdownGrace is over is cancelled and its message stays too.
func TestShutdown(t *testing.T) {
	t.Parallel()
	type outcome int
	const (
		succeeds outcome = iota
		fails
		outlastsGrace
	)
	for _, tc := range []struct {
		name string
		out  outcome
	}{{"handler finishes and is deleted", succeeds}, {"handler error is not deleted", fails}, {"grace over: handler cancelled", outlastsGrace}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := testenv.SQS(t)
			q, _ := testenv.Queue(t, c, 5, 30*time.Second)
			entered := make(chan struct{})
			var finished atomic.Bool
			h := func(ctx context.Context, d sqstransport.Delivery) error {
				close(entered)
				defer finished.Store(true)
				switch tc.out {
				case succeeds:
					time.Sleep(time.Second)
					return ctx.Err() // nil: the context outlives the cancel
				case fails:
					time.Sleep(500 * time.Millisecond)
					return errors.New("rolled back")
				default:
					<-ctx.Done()
					return ctx.Err()
				}
			}
			cfg := testConfig(q)
			cfg.RetryBase = 2 * time.Second
			if tc.out == outlastsGrace {
				cfg.ShutdownGrace = 700 * time.Millisecond
			}
			s, err := sqstransport.NewSubscriber(c, cfg, h)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- s.Run(ctx) }()
			send(t, c, q, newEvent(t, 1))
			select {
			case <-entered:
			case <-time.After(10 * time.Second):
				t.Fatal("handler never called")
			}
			cancel()
			began := time.Now()
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("Run: %v", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("Run did not return after cancel")
			}
			if !finished.Load() {
				t.Fatal("Run returned before the handler finished")
			}
			t.Logf("Run returned %v after cancel", time.Since(began).Round(time.Millisecond))

			v, i := depth(t, c, q)
			if tc.out == succeeds {
				if v+i != 0 {
					t.Fatalf("after shutdown: %d visible, %d in flight; want the handled message deleted", v, i)
				}
				return
			}
			if v+i != 1 {
				t.Fatalf("after shutdown: %d visible, %d in flight; want the message kept", v, i)
			}
			// It is delivered again.
			var got []types.Message
			for deadline := time.Now().Add(40 * time.Second); len(got) == 0 && time.Now().Before(deadline); {
				out, err := c.ReceiveMessage(context.Background(), &sqs.ReceiveMessageInput{QueueUrl: aws.String(q), WaitTimeSeconds: 1,
					MessageSystemAttributeNames: []types.MessageSystemAttributeName{types.MessageSystemAttributeNameApproximateReceiveCount}})
				if err != nil {
					t.Fatal(err)
				}
				got = out.Messages
			}
			if len(got) != 1 || got[0].Attributes["ApproximateReceiveCount"] != "2" {
				t.Fatalf("redelivery after shutdown: %v; want the message with receive count 2", got)
			}
		})
	}
}

// Concurrency N runs N handlers at once, and never more.
func TestConcurrencyRunsNHandlersAtOnce(t *testing.T) {
	t.Parallel()
	for _, n := range []int{1, 4} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			t.Parallel()
			c := testenv.SQS(t)
			q, _ := testenv.Queue(t, c, 5, 30*time.Second)
			msgs := 3 * n
			for i := range msgs {
				send(t, c, q, newEvent(t, i))
			}
			var active, peak, handled atomic.Int64
			h := func(ctx context.Context, d sqstransport.Delivery) error {
				now := active.Add(1)
				for p := peak.Load(); now > p && !peak.CompareAndSwap(p, now); p = peak.Load() {
				}
				time.Sleep(300 * time.Millisecond)
				active.Add(-1)
				handled.Add(1)
				return nil
			}
			cfg := testConfig(q)
			cfg.Concurrency = n
			start(t, c, cfg, h)
			waitFor(t, 20*time.Second, "all messages handled", func() bool { return handled.Load() == int64(msgs) })
			waitEmpty(t, c, q, 5*time.Second)
			if p := peak.Load(); p != int64(n) {
				t.Fatalf("at most %d handlers ran at once, want %d", p, n)
			}
		})
	}
}

// A crash after the handler committed and before the delete leaves the
// message; it is delivered again, so the consumer's dedupe key decides.
func TestCrashAfterCommitBeforeDeleteRedelivers(t *testing.T) {
	c := testenv.SQS(t)
	q, _ := testenv.Queue(t, c, 5, 30*time.Second)
	first := make(chan struct{})
	rec := &recorder{then: func(_ sqstransport.Delivery, n int) error {
		if n == 1 {
			close(first)
		}
		return nil
	}}
	cfg := testConfig(q)
	cfg.Visibility = time.Second
	disable := failpoint.Enable(failpoint.AfterCommitBeforeDelete, 1)
	defer disable()
	start(t, c, cfg, rec.handle)
	send(t, c, q, newEvent(t, 1))
	select {
	case <-first:
	case <-time.After(10 * time.Second):
		t.Fatal("handler never called")
	}
	time.Sleep(200 * time.Millisecond) // the failpoint fires right after the handler returns
	disable()
	waitFor(t, 10*time.Second, "the redelivery", func() bool { return len(rec.deliveries()) == 2 })
	waitEmpty(t, c, q, 5*time.Second)
	d := rec.deliveries()
	if d[0].Envelope.EventID != d[1].Envelope.EventID || d[1].ReceiveCount != 2 {
		t.Fatalf("redelivery %+v, want the same event with receive count 2", d[1])
	}
}

// NewSubscriber refuses a config without a queue.
func TestNewSubscriberNeedsAQueue(t *testing.T) {
	t.Parallel()
	if _, err := sqstransport.NewSubscriber(testenv.SQS(t), sqstransport.SubscriberConfig{Logger: slog.Default()}, nil); err == nil {
		t.Fatal("NewSubscriber without QueueURL succeeded")
	}
}

// Settings outside what SQS accepts are brought into range instead of
// breaking the subscriber: a WaitTime over 20 s (SQS rejects the receive,
// so nothing was ever delivered) and a sub-second Visibility (sent as 0
// seconds, which made every received message visible again at once, so a
// slow handler was raced by copies of its own message).
func TestOutOfRangeTimingsAreClamped(t *testing.T) {
	t.Parallel()
	t.Run("WaitTime over 20s", func(t *testing.T) {
		t.Parallel()
		c := testenv.SQS(t)
		q, _ := testenv.Queue(t, c, 5, 30*time.Second)
		rec := &recorder{}
		cfg := testConfig(q)
		cfg.WaitTime = 25 * time.Second
		r := start(t, c, cfg, rec.handle)
		send(t, c, q, newEvent(t, 1))
		waitFor(t, 10*time.Second, "the delivery", func() bool { return len(rec.deliveries()) == 1 })
		if err := r.stop(t, 30*time.Second); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("Visibility under 1s", func(t *testing.T) {
		t.Parallel()
		c := testenv.SQS(t)
		q, _ := testenv.Queue(t, c, 5, 30*time.Second)
		rec := &recorder{then: func(sqstransport.Delivery, int) error { time.Sleep(2 * time.Second); return nil }}
		cfg := testConfig(q)
		cfg.Visibility = 400 * time.Millisecond
		start(t, c, cfg, rec.handle)
		send(t, c, q, newEvent(t, 1))
		waitFor(t, 10*time.Second, "the delivery", func() bool { return len(rec.deliveries()) >= 1 })
		waitEmpty(t, c, q, 10*time.Second)
		if n := len(rec.deliveries()); n != 1 {
			t.Fatalf("%d deliveries of one message to one subscriber, want 1", n)
		}
	})
}

// dlqReasons long-polls dlq for up to timeout until want messages arrived
// and returns their park_reason attributes by body.
func dlqReasons(t testing.TB, c *sqs.Client, dlq string, want int, timeout time.Duration) map[string]string {
	t.Helper()
	got := map[string]string{}
	for deadline := time.Now().Add(timeout); len(got) < want && time.Now().Before(deadline); {
		out, err := c.ReceiveMessage(context.Background(), &sqs.ReceiveMessageInput{QueueUrl: aws.String(dlq),
			MaxNumberOfMessages: 10, WaitTimeSeconds: 1, MessageAttributeNames: []string{"All"}})
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range out.Messages {
			got[aws.ToString(m.Body)] = aws.ToString(m.MessageAttributes["park_reason"].StringValue)
		}
	}
	return got
}

// A handler that panics does not take the subscriber down: the panic is
// recovered and fails the message like an error (redelivered after a
// backoff), it is logged with its stack, the queue keeps flowing, and a
// message that keeps panicking is parked with reason "panic" on its
// MaxPanics-th receive, before SQS's own redrive would drop it in the DLQ
// without one.
func TestPanickingHandlerIsRecoveredAndRepeatedPanicsPark(t *testing.T) {
	t.Parallel()
	c := testenv.SQS(t)
	q, dlq := testenv.Queue(t, c, 5, 30*time.Second)
	bad, good := newEvent(t, 1), newEvent(t, 2)
	var badCalls atomic.Int64
	rec := &recorder{then: func(d sqstransport.Delivery, _ int) error {
		if d.Envelope.EventID == bad.EventID {
			badCalls.Add(1)
			panic("nil map in the cashback rule")
		}
		return nil
	}}
	logs := &testenv.Buffer{}
	cfg := testConfig(q)
	cfg.RetryMax = time.Second
	cfg.Logger = slog.New(slog.NewJSONHandler(logs, nil))
	start(t, c, cfg, rec.handle)
	send(t, c, q, bad)
	send(t, c, q, good)

	body, _ := bad.Marshal()
	reasons := dlqReasons(t, c, dlq, 1, 20*time.Second)
	if r, ok := reasons[string(body)]; !ok || !strings.HasPrefix(r, "panic: ") || !strings.Contains(r, "nil map in the cashback rule") {
		t.Fatalf("DLQ park reasons %v; want the panicking message with reason \"panic: ...\"", reasons)
	}
	waitEmpty(t, c, q, 5*time.Second)
	if n := badCalls.Load(); n != 3 {
		t.Errorf("the panicking handler ran %d times, want 3 (MaxPanics)", n)
	}
	delivered := false
	for _, d := range rec.deliveries() {
		delivered = delivered || d.Envelope.EventID == good.EventID
	}
	if !delivered {
		t.Error("the message behind the panicking one was never handled")
	}
	if n := counter(t, "sqs_messages_parked_total", queueName(q), "panic"); n != 1 {
		t.Errorf("sqs_messages_parked_total{reason=panic} = %d, want 1", n)
	}
	if l := logs.String(); !strings.Contains(l, "handler panicked") || !strings.Contains(l, "subscriber_test.go") {
		t.Errorf("the panic was not logged with its stack:\n%s", l)
	}
}

// A hung handler is cut at its deadline (HandlerTimeout, by default below
// the visibility timeout): its transaction rolls back, releasing the dedupe
// key it held locked, the message is left for redelivery and the timeout is
// counted. The redelivery applies the event once; without the deadline the
// hung effect would hold the key (and a pool connection) until the
// visibility extensions ran out, 15 minutes later.
func TestHungHandlerIsCutAtItsDeadlineRolledBackAndRedelivered(t *testing.T) {
	t.Parallel()
	c := testenv.SQS(t)
	q, _ := testenv.Queue(t, c, 5, 30*time.Second)
	pool := testenv.DB(t)
	ctx := context.Background()
	if err := idempotent.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE effects (event_id uuid NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	cons, err := idempotent.NewConsumer(pool, "rewards")
	if err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int64
	var firstRan atomic.Int64 // nanoseconds the hung call lasted
	h := func(ctx context.Context, d sqstransport.Delivery) error {
		n := calls.Add(1)
		t0 := time.Now()
		_, err := cons.Handle(ctx, idempotent.MessageOf(d.Envelope), func(ctx context.Context, tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `INSERT INTO effects VALUES ($1)`, d.Envelope.EventID); err != nil {
				return err
			}
			if n == 1 {
				<-ctx.Done() // an external call that never answers, the dedupe row locked
				firstRan.Store(int64(time.Since(t0)))
				return ctx.Err()
			}
			return nil
		})
		return err
	}
	cfg := testConfig(q) // Visibility 5s: the default deadline is 4s
	start(t, c, cfg, h)
	e := newEvent(t, 1)
	send(t, c, q, e)
	waitFor(t, 20*time.Second, "the redelivery to apply the event", func() bool {
		var n int64
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM effects`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 1
	})
	waitEmpty(t, c, q, 10*time.Second)
	if n := calls.Load(); n != 2 {
		t.Errorf("handler ran %d times, want 2 (the hung call, then the redelivery)", n)
	}
	if d := time.Duration(firstRan.Load()); d < 3500*time.Millisecond || d >= cfg.Visibility {
		t.Errorf("the hung call was cut after %v, want about 4s (below the 5s visibility timeout)", d)
	}
	if n := counter(t, "sqs_handler_timeouts_total", queueName(q), ""); n != 1 {
		t.Errorf("sqs_handler_timeouts_total = %d, want 1", n)
	}
	if _, err := sqstransport.NewSubscriber(c, sqstransport.SubscriberConfig{QueueURL: q, Visibility: 5 * time.Second,
		HandlerTimeout: 5 * time.Second}, h); err == nil {
		t.Error("NewSubscriber accepted a HandlerTimeout as long as the visibility timeout")
	}
}

// A park_reason is made of the error's text, which can hold anything: a
// field name from the body, decoded from an escape to U+FFFF, or a
// character cut in two by the 1000-byte limit. SQS refuses an attribute
// with either, and the park failed, leaving the message to be received
// again until the queue's own redrive moved it without a reason. The
// reason is now cut on a character and written in characters every queue
// accepts.
func TestAParkReasonOfAnyTextIsParked(t *testing.T) {
	t.Parallel()
	c := testenv.SQS(t)
	q, dlq := testenv.Queue(t, c, 5, 30*time.Second)
	e := newEvent(t, 1)
	rec := &recorder{then: func(sqstransport.Delivery, int) error {
		return sqstransport.Permanent(fmt.Errorf("field \"x\uffff😀\" refused: %s", strings.Repeat("é", 600)))
	}}
	cfg := testConfig(q)
	cfg.Concurrency = 1
	start(t, c, cfg, rec.handle)
	send(t, c, q, e)
	var reason string
	for deadline := time.Now().Add(15 * time.Second); reason == "" && time.Now().Before(deadline); {
		out, err := c.ReceiveMessage(context.Background(), &sqs.ReceiveMessageInput{QueueUrl: aws.String(dlq),
			MaxNumberOfMessages: 10, WaitTimeSeconds: 1, MessageAttributeNames: []string{"All"}})
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range out.Messages {
			reason = aws.ToString(m.MessageAttributes["park_reason"].StringValue)
		}
	}
	if !strings.HasPrefix(reason, "refused: field") {
		t.Fatalf("park_reason %q; want the message parked with the handler's reason", reason)
	}
	if !utf8.ValidString(reason) || strings.ContainsAny(reason, "\uffff😀") || len(reason) > 1000+len("refused: ") {
		t.Fatalf("park_reason %q: want valid UTF-8 within 1000 bytes, without U+FFFF or the emoji", reason)
	}
	if n := len(rec.deliveries()); n != 1 {
		t.Fatalf("handler called %d times, want 1: parked at once", n)
	}
}

// recordSends records the MessageAttributes of every SendMessage call a
// client makes.
func recordSends(mu *sync.Mutex, got *[]map[string]types.MessageAttributeValue) func(*middleware.Stack) error {
	return func(stack *middleware.Stack) error {
		return stack.Initialize.Add(middleware.InitializeMiddlewareFunc("recordSends",
			func(ctx context.Context, in middleware.InitializeInput, next middleware.InitializeHandler) (middleware.InitializeOutput, middleware.Metadata, error) {
				if p, ok := in.Parameters.(*sqs.SendMessageInput); ok {
					mu.Lock()
					*got = append(*got, maps.Clone(p.MessageAttributes))
					mu.Unlock()
				}
				return next.HandleInitialize(ctx, in)
			}), middleware.After)
	}
}

// A message that already carries 9 attributes is parked with its reason:
// SQS takes at most 10 attributes, so the copy keeps the three park ones,
// event_id, event_type and traceparent, and as many of the others as fit,
// and the ones it drops are logged by name. Every original attribute used
// to be copied beside the three park ones: real SQS refuses the send
// (moto does not check), the message was never parked and reached the DLQ
// through maxReceiveCount without its reason.
func TestAMessageWithManyAttributesIsParkedWithItsReasonWithinTenAttributes(t *testing.T) {
	t.Parallel()
	c := testenv.SQS(t)
	q, dlq := testenv.Queue(t, c, 5, 30*time.Second)
	var mu sync.Mutex
	var sent []map[string]types.MessageAttributeValue
	rec := sqs.New(c.Options(), func(o *sqs.Options) { o.APIOptions = append(o.APIOptions, recordSends(&mu, &sent)) })
	e := newEvent(t, 1)
	body, err := e.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	attrs := map[string]string{"event_id": e.EventID.String(), "event_type": e.EventType,
		"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
	for i := range 6 {
		attrs[fmt.Sprintf("x_%d", i)] = "v"
	}
	sendRaw(t, c, q, string(body), attrs)
	logs := &testenv.Buffer{}
	cfg := testConfig(q)
	cfg.Logger = slog.New(slog.NewJSONHandler(logs, nil))
	start(t, rec, cfg, func(context.Context, sqstransport.Delivery) error {
		return sqstransport.Permanent(errors.New("unknown currency XXX"))
	})
	var parked types.Message
	for deadline := time.Now().Add(15 * time.Second); parked.Body == nil && time.Now().Before(deadline); {
		out, err := c.ReceiveMessage(context.Background(), &sqs.ReceiveMessageInput{QueueUrl: aws.String(dlq),
			MaxNumberOfMessages: 10, WaitTimeSeconds: 1, MessageAttributeNames: []string{"All"}})
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range out.Messages {
			parked = m
		}
	}
	if parked.Body == nil {
		t.Fatal("nothing parked in the DLQ")
	}
	mu.Lock()
	defer mu.Unlock()
	if len(sent) != 1 {
		t.Fatalf("%d SendMessage calls, want the one park", len(sent))
	}
	for what, got := range map[string]map[string]types.MessageAttributeValue{"sent": sent[0], "parked copy": parked.MessageAttributes} {
		if len(got) > 10 {
			t.Errorf("%s has %d attributes, more than the 10 SQS accepts: %v", what, len(got), slices.Sorted(maps.Keys(got)))
		}
		if r := aws.ToString(got["park_reason"].StringValue); r != "refused: unknown currency XXX" {
			t.Errorf("%s park_reason %q, want the handler's reason", what, r)
		}
		for _, k := range []string{"park_source_queue", "park_source_message_id", "event_id", "event_type", "traceparent"} {
			if aws.ToString(got[k].StringValue) == "" {
				t.Errorf("%s lacks %s: %v", what, k, slices.Sorted(maps.Keys(got)))
			}
		}
	}
	if want := []string{"x_0", "x_1", "x_2", "x_3"}; !slices.Equal(keptOf(sent[0], "x_"), want) {
		t.Errorf("kept %v of the other attributes, want %v (the first in name order, as many as fit)", keptOf(sent[0], "x_"), want)
	}
	if l := logs.String(); !strings.Contains(l, `"dropped":["x_4","x_5"]`) {
		t.Errorf("the dropped attributes were not logged by name:\n%s", l)
	}
}

// keptOf is the sorted names in attrs that start with prefix.
func keptOf(attrs map[string]types.MessageAttributeValue, prefix string) []string {
	var out []string
	for k := range attrs {
		if strings.HasPrefix(k, prefix) {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}
