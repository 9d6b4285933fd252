package inboxsqs_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/effectively-once/payments-cashback/internal/testenv"
	"github.com/effectively-once/payments-cashback/pkg/events"
	"github.com/effectively-once/payments-cashback/pkg/idempotent"
	"github.com/effectively-once/payments-cashback/pkg/idempotent/inboxsqs"
	"github.com/effectively-once/payments-cashback/pkg/sqstransport"
)

func TestMain(m *testing.M) { testenv.Main(m) }

type stack struct {
	pool     *pgxpool.Pool
	sqs      *sqs.Client
	queue    string
	dlq      string
	in       *idempotent.Inbox
	latency  *latencies
	stopSubs func()
}

type latencies struct {
	mu sync.Mutex
	d  []time.Duration
}

func (l *latencies) add(d time.Duration) { l.mu.Lock(); l.d = append(l.d, d); l.mu.Unlock() }
func (l *latencies) max() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	var m time.Duration
	for _, d := range l.d {
		m = max(m, d)
	}
	return m
}

// newStack wires what a service wires: a database with the library schema,
// a queue with its DLQ, an Inbox, and a Subscriber feeding the inbox through
// inboxsqs.Handler (timed, so tests can see how long acks take).
func newStack(t *testing.T, cfg idempotent.InboxConfig) *stack {
	t.Helper()
	ctx := context.Background()
	s := &stack{pool: testenv.DB(t), sqs: testenv.SQS(t), latency: &latencies{}}
	if err := idempotent.Migrate(ctx, s.pool); err != nil {
		t.Fatal(err)
	}
	if _, err := s.pool.Exec(ctx, `CREATE TABLE applied (event_id uuid PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	s.queue, s.dlq = testenv.Queue(t, s.sqs, 5, 30*time.Second)
	var err error
	if s.in, err = idempotent.NewInbox(s.pool, "notifications", cfg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.in.Close() })
	h := inboxsqs.Handler(s.in, idempotent.ByAggregate)
	timed := func(ctx context.Context, d sqstransport.Delivery) error {
		start := time.Now()
		err := h(ctx, d)
		s.latency.add(time.Since(start))
		return err
	}
	sub, err := sqstransport.NewSubscriber(s.sqs, sqstransport.SubscriberConfig{QueueURL: s.queue, DLQURL: s.dlq,
		WaitTime: time.Second, Visibility: 30 * time.Second, ShutdownGrace: 5 * time.Second}, timed)
	if err != nil {
		t.Fatal(err)
	}
	subCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { _ = sub.Run(subCtx); close(done) }()
	var once sync.Once
	s.stopSubs = func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(s.stopSubs)
	return s
}

func (s *stack) send(t *testing.T, evs ...events.Envelope) {
	t.Helper()
	for len(evs) > 0 {
		n := min(10, len(evs))
		var entries []types.SendMessageBatchRequestEntry
		for i, e := range evs[:n] {
			body, err := e.Marshal()
			if err != nil {
				t.Fatal(err)
			}
			entries = append(entries, types.SendMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), MessageBody: aws.String(string(body))})
		}
		out, err := s.sqs.SendMessageBatch(context.Background(), &sqs.SendMessageBatchInput{QueueUrl: aws.String(s.queue), Entries: entries})
		if err != nil || len(out.Failed) > 0 {
			t.Fatalf("send: %v %v", err, out)
		}
		evs = evs[n:]
	}
}

// depth is visible + in flight: 0 once every message was deleted.
func depth(t *testing.T, c *sqs.Client, q string) int {
	t.Helper()
	out, err := c.GetQueueAttributes(context.Background(), &sqs.GetQueueAttributesInput{QueueUrl: aws.String(q),
		AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameApproximateNumberOfMessages, types.QueueAttributeNameApproximateNumberOfMessagesNotVisible}})
	if err != nil {
		t.Fatal(err)
	}
	v, _ := strconv.Atoi(out.Attributes[string(types.QueueAttributeNameApproximateNumberOfMessages)])
	f, _ := strconv.Atoi(out.Attributes[string(types.QueueAttributeNameApproximateNumberOfMessagesNotVisible)])
	return v + f
}

func count(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) int64 {
	t.Helper()
	var n int64
	if err := pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func event(t *testing.T, key string, version int64) events.Envelope {
	t.Helper()
	e, err := events.New("CashbackCredited", key, version, map[string]any{"amount_paise": 2400})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// runProcessor runs 4 workers on a pool of their own, as ProcessorConfig.Pool
// advises, so that blocked handlers cannot take the receiver's connections.
func runProcessor(t *testing.T, s *stack, h idempotent.ProcessFunc) {
	t.Helper()
	cfg := s.pool.Config()
	cfg.MaxConns = 5
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	p, err := s.in.NewProcessor(h, idempotent.ProcessorConfig{Workers: 4, PollInterval: 20 * time.Millisecond, Pool: pool})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = p.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
}

// The handler takes "forever" (it blocks until the test ends), yet every
// message is stored and deleted from the queue within milliseconds.
func TestAckDoesNotWaitForTheHandler(t *testing.T) {
	t.Parallel()
	s := newStack(t, idempotent.InboxConfig{})
	release := make(chan struct{})
	var entered atomic.Int64
	runProcessor(t, s, func(ctx context.Context, tx pgx.Tx, e events.Envelope) error {
		entered.Add(1)
		select { // a 40 s provider call, or longer
		case <-release:
		case <-ctx.Done():
			return ctx.Err()
		}
		_, err := tx.Exec(ctx, `INSERT INTO applied VALUES ($1)`, e.EventID)
		return err
	})
	var evs []events.Envelope
	for i := range 30 {
		evs = append(evs, event(t, fmt.Sprintf("cb_%d", i), 1))
	}
	var once sync.Once
	t.Cleanup(func() { once.Do(func() { close(release) }) }) // before the processor's cleanup
	start := time.Now()
	s.send(t, evs...)
	waitFor(t, 10*time.Second, "all messages deleted from the queue", func() bool {
		return depth(t, s.sqs, s.queue) == 0
	})
	drained := time.Since(start)
	if n := count(t, s.pool, `SELECT count(*) FROM inbox WHERE status = 'PENDING'`); n != 30 {
		t.Fatalf("PENDING rows = %d, want 30", n)
	}
	if entered.Load() == 0 {
		t.Fatal("the processor never started a handler; the test proves nothing")
	}
	if m := s.latency.max(); m > time.Second {
		t.Fatalf("slowest receive took %v; the ack must not wait for the handler", m)
	}
	t.Logf("30 messages acked in %v while handlers were blocked; slowest receive %v", drained, s.latency.max())
	once.Do(func() { close(release) })
	waitFor(t, 10*time.Second, "all DONE", func() bool {
		return count(t, s.pool, `SELECT count(*) FROM inbox WHERE status = 'DONE'`) == 30
	})
}

// A copy that arrives after its event was applied (a relay resend, a redrive
// with a new SQS message id) is acked and changes nothing; a copy with the
// same id and another payload is parked, not acked silently.
func TestDuplicateAfterDoneIsAckedAndIgnored(t *testing.T) {
	t.Parallel()
	s := newStack(t, idempotent.InboxConfig{})
	var calls atomic.Int64
	runProcessor(t, s, func(ctx context.Context, tx pgx.Tx, e events.Envelope) error {
		calls.Add(1)
		_, err := tx.Exec(ctx, `INSERT INTO applied VALUES ($1)`, e.EventID)
		return err
	})
	e := event(t, "cb_1", 1)
	s.send(t, e)
	waitFor(t, 10*time.Second, "row DONE", func() bool {
		return count(t, s.pool, `SELECT count(*) FROM inbox WHERE status = 'DONE'`) == 1
	})
	var before time.Time
	if err := s.pool.QueryRow(context.Background(), `SELECT processed_at FROM inbox`).Scan(&before); err != nil {
		t.Fatal(err)
	}

	s.send(t, e, e) // two more copies, new SQS message ids
	waitFor(t, 10*time.Second, "copies deleted", func() bool { return depth(t, s.sqs, s.queue) == 0 })
	time.Sleep(200 * time.Millisecond) // a processor that wrongly re-ran would do it now
	var after time.Time
	var attempts int
	if err := s.pool.QueryRow(context.Background(), `SELECT processed_at, attempts FROM inbox`).Scan(&after, &attempts); err != nil {
		t.Fatal(err)
	}
	if calls.Load() != 1 || attempts != 1 || !after.Equal(before) || count(t, s.pool, `SELECT count(*) FROM applied`) != 1 {
		t.Fatalf("after duplicates: %d handler calls, attempts %d, processed_at moved %v; want 1, 1, unchanged",
			calls.Load(), attempts, !after.Equal(before))
	}
	if n := depth(t, s.sqs, s.dlq); n != 0 {
		t.Fatalf("%d duplicates parked in the DLQ; they must be acked", n)
	}

	forged := e
	forged.Payload = []byte(`{"amount_paise":999999}`)
	s.send(t, forged)
	m := parked(t, s, 1)
	if !strings.Contains(m[0], "different payload") {
		t.Fatalf("park reason %q, want the conflict", m[0])
	}
}

// A copy older than the dedupe window is refused at receive time: not
// stored, not applied, and parked in the DLQ with the reason.
func TestExpiredMessageIsRefusedAndParked(t *testing.T) {
	t.Parallel()
	s := newStack(t, idempotent.InboxConfig{})
	old := event(t, "cb_1", 1)
	old.OccurredAt = time.Now().Add(-16 * 24 * time.Hour).UTC()
	s.send(t, old)
	reasons := parked(t, s, 1)
	if !strings.Contains(reasons[0], "dedupe window") {
		t.Fatalf("park reason %q, want the dedupe window", reasons[0])
	}
	if n := count(t, s.pool, `SELECT count(*) FROM inbox`); n != 0 {
		t.Fatalf("%d inbox rows for a refused copy", n)
	}
}

// parked waits for n messages in the DLQ and returns their park reasons.
func parked(t *testing.T, s *stack, n int) []string {
	t.Helper()
	var reasons []string
	deadline := time.Now().Add(10 * time.Second)
	for len(reasons) < n && time.Now().Before(deadline) {
		out, err := s.sqs.ReceiveMessage(context.Background(), &sqs.ReceiveMessageInput{QueueUrl: aws.String(s.dlq),
			MaxNumberOfMessages: 10, WaitTimeSeconds: 1, MessageAttributeNames: []string{"All"}})
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range out.Messages {
			reasons = append(reasons, aws.ToString(m.MessageAttributes["park_reason"].StringValue))
		}
	}
	if len(reasons) != n {
		t.Fatalf("%d messages parked, want %d", len(reasons), n)
	}
	return reasons
}
