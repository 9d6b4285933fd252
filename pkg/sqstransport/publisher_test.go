package sqstransport_test

import (
	"context"
	"encoding/json"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/smithy-go/middleware"
	"github.com/google/uuid"

	"github.com/effectively-once/payments-cashback/internal/testenv"
	"github.com/effectively-once/payments-cashback/pkg/outbox"
	"github.com/effectively-once/payments-cashback/pkg/sqstransport"
)

// dropFirstSuccess makes a client's SendMessageBatch responses forget their
// first Successful entry, as a response that lists an entry neither as
// succeeded nor as failed would; dropped gets the ids it forgot.
func dropFirstSuccess(dropped *[]string) func(*middleware.Stack) error {
	return func(stack *middleware.Stack) error {
		return stack.Initialize.Add(middleware.InitializeMiddlewareFunc("dropFirstSuccess",
			func(ctx context.Context, in middleware.InitializeInput, next middleware.InitializeHandler) (middleware.InitializeOutput, middleware.Metadata, error) {
				out, md, err := next.HandleInitialize(ctx, in)
				if o, ok := out.Result.(*sqs.SendMessageBatchOutput); ok && len(o.Successful) > 0 {
					*dropped = append(*dropped, aws.ToString(o.Successful[0].Id))
					o.Successful = o.Successful[1:]
				}
				return out, md, err
			}), middleware.After)
	}
}

// An entry that a SendMessageBatch response lists neither as succeeded nor
// as failed is not known to be accepted, so the publisher reports it as
// failed (the relay then retries it: a possible duplicate, never a loss).
func TestPublisherCountsAnEntryMissingFromTheResponseAsFailed(t *testing.T) {
	c := testenv.SQS(t)
	q, _ := testenv.Queue(t, c, 5, 30*time.Second)
	var dropped []string
	lossy := sqs.New(c.Options(), func(o *sqs.Options) { o.APIOptions = append(o.APIOptions, dropFirstSuccess(&dropped)) })
	msgs := make([]outbox.Message, 3)
	for i := range msgs {
		e := newEvent(t, i)
		body, _ := json.Marshal(e)
		msgs[i] = outbox.Message{EventID: e.EventID, Body: body, Attributes: map[string]string{"event_id": e.EventID.String()}}
	}
	failed, err := sqstransport.NewPublisher(lossy, q, 1).PublishBatch(context.Background(), msgs)
	if err != nil {
		t.Fatal(err)
	}
	if len(dropped) != 1 {
		t.Fatalf("the response lost %v, want one entry", dropped)
	}
	missing := uuid.MustParse(dropped[0])
	if len(failed) != 1 || failed[missing] == nil {
		t.Fatalf("failed = %v, want exactly the entry missing from the response (%s)", failed, missing)
	}
}

// countInFlight counts a client's SendMessageBatch calls in flight and
// records the most seen at once; each call is held a little, so calls that
// may overlap do.
func countInFlight(now, most *atomic.Int64) func(*middleware.Stack) error {
	return func(stack *middleware.Stack) error {
		return stack.Initialize.Add(middleware.InitializeMiddlewareFunc("countInFlight",
			func(ctx context.Context, in middleware.InitializeInput, next middleware.InitializeHandler) (middleware.InitializeOutput, middleware.Metadata, error) {
				n := now.Add(1)
				for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
				}
				time.Sleep(20 * time.Millisecond)
				defer now.Add(-1)
				return next.HandleInitialize(ctx, in)
			}), middleware.After)
	}
}

// The in-flight limit is the Publisher's, not each PublishBatch call's: two
// relay workers publishing at once through one Publisher keep at most its
// limit of SendMessageBatch calls in flight together, and every message is
// sent.
func TestPublisherInFlightLimitIsSharedByConcurrentBatches(t *testing.T) {
	c := testenv.SQS(t)
	q, _ := testenv.Queue(t, c, 5, 30*time.Second)
	var now, most atomic.Int64
	counted := sqs.New(c.Options(), func(o *sqs.Options) { o.APIOptions = append(o.APIOptions, countInFlight(&now, &most)) })
	pub := sqstransport.NewPublisher(counted, q, 3)
	var wg sync.WaitGroup
	var failures atomic.Int64
	for w := range 2 {
		msgs := make([]outbox.Message, 60)
		for i := range msgs {
			e := newEvent(t, w*100+i)
			body, _ := json.Marshal(e)
			msgs[i] = outbox.Message{EventID: e.EventID, Body: body, Attributes: map[string]string{"event_id": e.EventID.String()}}
		}
		wg.Go(func() {
			failed, err := pub.PublishBatch(context.Background(), msgs)
			if err != nil || len(failed) > 0 {
				failures.Add(1)
			}
		})
	}
	wg.Wait()
	if failures.Load() > 0 {
		t.Fatal("a batch failed")
	}
	if m := most.Load(); m > 3 || m < 2 {
		t.Fatalf("at most %d SendMessageBatch calls were in flight together, want the Publisher's limit (3) shared by both batches", m)
	}
}
