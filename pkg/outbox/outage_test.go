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

	"github.com/effectively-once/payments-cashback/internal/faults"
	"github.com/effectively-once/payments-cashback/internal/testenv"
	"github.com/effectively-once/payments-cashback/pkg/events"
	"github.com/effectively-once/payments-cashback/pkg/outbox"
	"github.com/effectively-once/payments-cashback/pkg/sqstransport"
)

// A relay whose SQS is unreachable backs off instead of flooding it: with
// a backlog of 100 batches, and producers committing (and notifying) every
// 20 ms throughout, it makes a handful of SendMessageBatch attempts while
// the queue is away, not one per batch nor one per commit, and once the
// queue is back every row is published.
func TestARelayWhoseQueueIsUnreachableBacksOffAndCatchesUpAfter(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := setup(t)
	c := testenv.SQS(t)
	q, _ := testenv.Queue(t, c, 5, 30*time.Second)
	fx := faults.New()
	t.Cleanup(fx.Close)
	host, err := faults.HostPort(aws.ToString(c.Options().BaseEndpoint))
	if err != nil {
		t.Fatal(err)
	}
	px, err := fx.Proxy("sqs", host)
	if err != nil {
		t.Fatal(err)
	}
	opts := c.Options()
	opts.BaseEndpoint, opts.RetryMaxAttempts = aws.String("http://"+px.Addr()), 1
	pub := &countingPublisher{next: sqstransport.NewPublisher(sqs.New(opts), q, 4)}

	const rows = 1000
	evs := make([]events.Envelope, rows)
	for i := range evs {
		evs[i] = newEvent(t, i)
	}
	addCommitted(t, ctx, pool, evs...)
	px.Cut()
	runRelay(t, newRelay(t, pool, pub, outbox.RelayConfig{BatchSize: 10, Workers: 2, PollInterval: 50 * time.Millisecond, RetryMax: 2 * time.Second}))
	added := 0
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end); added++ {
		addCommitted(t, ctx, pool, newEvent(t, rows+added))
		time.Sleep(20 * time.Millisecond)
	}
	pub.mu.Lock()
	attempts := pub.calls
	pub.mu.Unlock()
	t.Logf("%d publish attempts in 2 s with the queue unreachable, %d batches waiting and %d commits", attempts, rows/10, added)
	if attempts == 0 || attempts > 20 {
		t.Fatalf("%d publish attempts in 2 s of outage; want a few (backoff), not one per batch", attempts)
	}
	if err := px.Restore(); err != nil {
		t.Fatal(err)
	}
	// A slow SQS server on a loaded machine takes a good part of a
	// minute for the backlog.
	waitFor(t, 2*time.Minute, "every row published", func() bool {
		return count(t, pool, `SELECT count(*) FROM outbox WHERE published_at IS NOT NULL`) == int64(rows+added)
	})
	out, err := c.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: &q,
		AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameApproximateNumberOfMessages}})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := out.Attributes[string(types.QueueAttributeNameApproximateNumberOfMessages)], fmt.Sprint(rows+added); got != want {
		t.Fatalf("queue holds %s messages, want %s", got, want)
	}
}

// A relay whose every send is refused for a cause that is not an outage
// (here the queue does not exist: SQS answers 400, as it does for a wrong
// URL, a denied permission or expired credentials) backs off as for an
// unreachable queue, and logs each failed batch once, not once per row.
// Before, it claimed, failed and rescheduled batch after batch at full
// speed (about 200 SendMessageBatch calls in 2 s), with a warning for
// every row of every attempt, and the backlog's attempts grew with it.
func TestARelayWhoseEverySendIsRefusedBacksOffAndLogsOncePerBatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := setup(t)
	c := testenv.SQS(t)
	q, _ := testenv.Queue(t, c, 5, 30*time.Second)
	pub := &countingPublisher{next: sqstransport.NewPublisher(c, q+"-gone", 4)}
	const rows = 1000
	evs := make([]events.Envelope, rows)
	for i := range evs {
		evs[i] = newEvent(t, i)
	}
	addCommitted(t, ctx, pool, evs...)
	logs := &messageLog{}
	stop := runRelay(t, newRelay(t, pool, pub, outbox.RelayConfig{BatchSize: 10, Workers: 2, PollInterval: 50 * time.Millisecond,
		RetryMax: 2 * time.Second, Logger: slog.New(logs)}))
	time.Sleep(2 * time.Second)
	stop()
	pub.mu.Lock()
	calls := pub.calls
	pub.mu.Unlock()
	tried := count(t, pool, `SELECT count(*) FROM outbox WHERE attempts > 0`)
	refused := count(t, pool, `SELECT count(*) FROM outbox WHERE last_error LIKE '%NonExistentQueue%' OR last_error LIKE '%QueueDoesNotExist%'`)
	t.Logf("%d publish calls in 2 s to a queue that does not exist; %d rows tried, %d with its error", calls, tried, refused)
	if calls == 0 || calls > 20 {
		t.Fatalf("%d PublishBatch calls in 2 s while every send is refused; want a few (backoff), not one per batch", calls)
	}
	if tried > int64(calls*10) || refused != tried || tried == 0 {
		t.Errorf("%d rows tried, %d with the queue's error, after %d calls of 10; want each tried row's error recorded, none untried counted", tried, refused, calls)
	}
	perRow, perBatch := logs.count("outbox publish failed: rescheduled"), logs.count("outbox batch publish failed: rescheduled")
	if perRow != 0 || perBatch != calls {
		t.Errorf("logged %d per-row and %d per-batch failures for %d failed calls; want none per row, one per batch", perRow, perBatch, calls)
	}
	if n := count(t, pool, `SELECT count(*) FROM outbox WHERE published_at IS NOT NULL`); n != 0 {
		t.Errorf("%d rows marked published with every send refused", n)
	}
}

// messageLog is a slog handler that counts records by message, at every
// level.
type messageLog struct {
	mu   sync.Mutex
	msgs map[string]int
}

func (h *messageLog) Enabled(context.Context, slog.Level) bool { return true }
func (h *messageLog) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.msgs == nil {
		h.msgs = map[string]int{}
	}
	h.msgs[r.Message]++
	return nil
}
func (h *messageLog) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *messageLog) WithGroup(string) slog.Handler      { return h }

// count is how many records had a message starting with prefix.
func (h *messageLog) count(prefix string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for m, c := range h.msgs {
		if strings.HasPrefix(m, prefix) {
			n += c
		}
	}
	return n
}
