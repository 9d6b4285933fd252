package outbox_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/effectively-once/payments-cashback/internal/testenv"
	"github.com/effectively-once/payments-cashback/pkg/events"
	"github.com/effectively-once/payments-cashback/pkg/outbox"
	"github.com/effectively-once/payments-cashback/pkg/sqstransport"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// setup returns a pool on a fresh database with the outbox schema.
func setup(t testing.TB) *pgxpool.Pool {
	t.Helper()
	pool := testenv.DB(t)
	if err := outbox.Migrate(context.Background(), pool); err != nil {
		t.Fatal(err)
	}
	return pool
}

// replicaPool opens another pool on the same database as pool, as a relay
// replica in another process would have.
func replicaPool(t testing.TB, pool *pgxpool.Pool) *pgxpool.Pool {
	t.Helper()
	p, err := pgxpool.NewWithConfig(context.Background(), pool.Config().Copy())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// queue returns a fresh SQS queue (with DLQ) and a Publisher to it.
func queue(t testing.TB) (*sqs.Client, string, *sqstransport.Publisher) {
	t.Helper()
	c := testenv.SQS(t)
	q, _ := testenv.Queue(t, c, 5, 30*time.Second)
	return c, q, sqstransport.NewPublisher(c, q, 4)
}

func newEvent(t testing.TB, i int) events.Envelope {
	t.Helper()
	e, err := events.New("PaymentSucceeded", fmt.Sprintf("pay_%d", i), 1,
		map[string]any{"payment_id": fmt.Sprintf("pay_%d", i), "user_id": "u_17", "amount_paise": 120000})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// addCommitted writes events through outbox.Add in one committed transaction.
func addCommitted(t testing.TB, ctx context.Context, pool *pgxpool.Pool, evs ...events.Envelope) {
	t.Helper()
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		for _, e := range evs {
			if err := outbox.Add(ctx, tx, e); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// What a producer's Notifier sends after its commit.
	if _, err := pool.Exec(ctx, `SELECT pg_notify($1, '')`, outbox.Channel); err != nil {
		t.Fatal(err)
	}
}

func count(t testing.TB, pool *pgxpool.Pool, sql string, args ...any) int64 {
	t.Helper()
	var n int64
	if err := pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

func newRelay(t testing.TB, pool *pgxpool.Pool, pub outbox.Publisher, cfg outbox.RelayConfig) *outbox.Relay {
	t.Helper()
	r, err := outbox.NewRelay(pool, pub, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// runRelay runs r in the background; the returned stop cancels it and
// waits for Run to return (it also runs at cleanup).
func runRelay(t testing.TB, r *outbox.Relay) (stop func()) {
	t.Helper()
	return testenv.Background(t, "Relay.Run", r.Run)
}

// received is one message as a consumer sees it on the queue.
type received struct {
	MessageID    string
	Body         []byte
	Attributes   map[string]string
	ReceiveCount string
	Receipt      string
	At           time.Time
}

// receive long-polls q until want messages arrived or timeout passed,
// deleting what it receives when del is set.
func receive(t testing.TB, c *sqs.Client, q string, want int, timeout time.Duration, del bool) []received {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var got []received
	for len(got) < want && ctx.Err() == nil {
		msgs, err := receiveBatch(ctx, c, q, 1)
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			t.Fatalf("ReceiveMessage: %v", err)
		}
		got = append(got, msgs...)
		if del {
			deleteAll(t, c, q, msgs)
		}
	}
	return got
}

func receiveBatch(ctx context.Context, c *sqs.Client, q string, wait int32) ([]received, error) {
	out, err := c.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{
		QueueUrl: aws.String(q), MaxNumberOfMessages: 10, WaitTimeSeconds: wait,
		// Short, so that a response lost on the wire (the SDK retries the
		// call; the messages it carried stay invisible) costs seconds, not 30.
		VisibilityTimeout:           5,
		MessageAttributeNames:       []string{"All"},
		MessageSystemAttributeNames: []types.MessageSystemAttributeName{types.MessageSystemAttributeNameApproximateReceiveCount},
	})
	if err != nil {
		return nil, err
	}
	now := time.Now()
	msgs := make([]received, 0, len(out.Messages))
	for _, m := range out.Messages {
		r := received{MessageID: aws.ToString(m.MessageId), Body: []byte(aws.ToString(m.Body)),
			Attributes: map[string]string{}, At: now, ReceiveCount: m.Attributes["ApproximateReceiveCount"],
			Receipt: aws.ToString(m.ReceiptHandle)}
		for k, v := range m.MessageAttributes {
			r.Attributes[k] = aws.ToString(v.StringValue)
		}
		msgs = append(msgs, r)
	}
	return msgs, nil
}

func deleteAll(t testing.TB, c *sqs.Client, q string, msgs []received) {
	t.Helper()
	if err := deleteBatch(context.Background(), c, q, msgs); err != nil {
		t.Fatal(err)
	}
}

func deleteBatch(ctx context.Context, c *sqs.Client, q string, msgs []received) error {
	if len(msgs) == 0 {
		return nil
	}
	entries := make([]types.DeleteMessageBatchRequestEntry, len(msgs))
	for i, m := range msgs {
		entries[i] = types.DeleteMessageBatchRequestEntry{Id: aws.String(fmt.Sprint(i)), ReceiptHandle: aws.String(m.Receipt)}
	}
	out, err := c.DeleteMessageBatch(ctx, &sqs.DeleteMessageBatchInput{QueueUrl: aws.String(q), Entries: entries})
	if err != nil {
		return fmt.Errorf("DeleteMessageBatch: %w", err)
	}
	if len(out.Failed) > 0 {
		return fmt.Errorf("DeleteMessageBatch: %d failed: %s", len(out.Failed), aws.ToString(out.Failed[0].Message))
	}
	return nil
}

// errorLog is a slog handler that records error-level records (and drops
// the rest, keeping test output readable).
type errorLog struct {
	mu      sync.Mutex
	records []string
}

func (h *errorLog) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (h *errorLog) Handle(_ context.Context, r slog.Record) error {
	if r.Level < slog.LevelError {
		return nil
	}
	var b strings.Builder
	b.WriteString(r.Message)
	r.Attrs(func(a slog.Attr) bool { fmt.Fprintf(&b, " %s=%v", a.Key, a.Value); return true })
	h.mu.Lock()
	h.records = append(h.records, b.String())
	h.mu.Unlock()
	return nil
}
func (h *errorLog) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *errorLog) WithGroup(string) slog.Handler      { return h }
func (h *errorLog) errors() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.records...)
}

// countingPublisher wraps a Publisher and counts what it was asked to send
// and, per id, how often the queue accepted it.
type countingPublisher struct {
	next     outbox.Publisher
	mu       sync.Mutex
	calls    int
	sent     int
	maxBatch int
	accepted map[uuid.UUID]int
}

func (p *countingPublisher) PublishBatch(ctx context.Context, msgs []outbox.Message) (map[uuid.UUID]error, error) {
	p.mu.Lock()
	p.calls++
	p.sent += len(msgs)
	p.maxBatch = max(p.maxBatch, len(msgs))
	p.mu.Unlock()
	failed, err := p.next.PublishBatch(ctx, msgs)
	if err != nil {
		return failed, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.accepted == nil {
		p.accepted = map[uuid.UUID]int{}
	}
	for _, m := range msgs {
		if _, bad := failed[m.EventID]; !bad {
			p.accepted[m.EventID]++
		}
	}
	return failed, nil
}

// waitFor polls cond every 20ms until it holds or timeout passes.
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
