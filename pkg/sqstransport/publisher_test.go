package sqstransport_test

import (
	"context"
	"encoding/json"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
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
	i, err := strconv.Atoi(dropped[0]) // an entry's Id is its index in the call
	if err != nil || i < 0 || i >= len(msgs) {
		t.Fatalf("the response lost entry %q, not an index of the call", dropped[0])
	}
	missing := msgs[i].EventID
	if len(failed) != 1 || failed[missing] == nil {
		t.Fatalf("failed = %v, want exactly the entry missing from the response (%s)", failed, missing)
	}
}

// rejectLast makes a client's SendMessageBatch responses list their last
// Successful entry as Failed instead, as SQS does with an entry it refuses.
func rejectLast(rejected *[]string) func(*middleware.Stack) error {
	return func(stack *middleware.Stack) error {
		return stack.Initialize.Add(middleware.InitializeMiddlewareFunc("rejectLast",
			func(ctx context.Context, in middleware.InitializeInput, next middleware.InitializeHandler) (middleware.InitializeOutput, middleware.Metadata, error) {
				out, md, err := next.HandleInitialize(ctx, in)
				if o, ok := out.Result.(*sqs.SendMessageBatchOutput); ok && len(o.Successful) > 0 {
					last := o.Successful[len(o.Successful)-1]
					*rejected = append(*rejected, aws.ToString(last.Id))
					o.Successful = o.Successful[:len(o.Successful)-1]
					o.Failed = append(o.Failed, types.BatchResultErrorEntry{Id: last.Id, Code: aws.String("InvalidParameterValue"),
						Message: aws.String("refused"), SenderFault: true})
				}
				return out, md, err
			}), middleware.After)
	}
}

// An entry SQS lists as Failed is reported as failed with SQS's reason, and
// only that entry: the others of its call were accepted.
func TestPublisherReportsExactlyTheEntriesSQSRejected(t *testing.T) {
	c := testenv.SQS(t)
	q, _ := testenv.Queue(t, c, 5, 30*time.Second)
	var rejected []string
	picky := sqs.New(c.Options(), func(o *sqs.Options) { o.APIOptions = append(o.APIOptions, rejectLast(&rejected)) })
	msgs := make([]outbox.Message, 13) // two calls: 10 and 3
	for i := range msgs {
		e := newEvent(t, i)
		body, _ := json.Marshal(e)
		msgs[i] = outbox.Message{EventID: e.EventID, Body: body, Attributes: map[string]string{"event_id": e.EventID.String()}}
	}
	failed, err := sqstransport.NewPublisher(picky, q, 1).PublishBatch(context.Background(), msgs)
	if err != nil {
		t.Fatal(err)
	}
	if len(rejected) != 2 {
		t.Fatalf("rejected %v, want the last entry of each of the two calls", rejected)
	}
	want := map[uuid.UUID]bool{msgs[9].EventID: true, msgs[12].EventID: true}
	if len(failed) != len(want) {
		t.Fatalf("failed = %v, want exactly the rejected messages 9 and 12", failed)
	}
	for id, err := range failed {
		if !want[id] || !strings.Contains(err.Error(), "InvalidParameterValue: refused") {
			t.Fatalf("failed[%s] = %v, want only messages 9 and 12, with SQS's reason", id, err)
		}
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

// senders counts the goroutines that are p's senders (a traceback shows
// the receiver as the first argument).
func senders(p *sqstransport.Publisher) int {
	buf := make([]byte, 1<<20)
	return strings.Count(string(buf[:runtime.Stack(buf, true)]), fmt.Sprintf("sqstransport.(*Publisher).sender(%p,", p))
}

// A Publisher's calls are made by long-lived senders, never more than about
// one per slot however many batches pass, and they end once idle: a
// Publisher nobody uses holds no goroutine and needs no Close.
func TestPublisherSendersAreReusedAndEndWhenIdle(t *testing.T) {
	c := testenv.SQS(t)
	q, _ := testenv.Queue(t, c, 5, 30*time.Second)
	pub := sqstransport.NewPublisher(c, q, 2)
	sqstransport.SetSenderIdle(pub, 200*time.Millisecond)
	most := 0
	for b := range 5 {
		msgs := make([]outbox.Message, 30)
		for i := range msgs {
			e := newEvent(t, b*100+i)
			body, _ := json.Marshal(e)
			msgs[i] = outbox.Message{EventID: e.EventID, Body: body, Attributes: map[string]string{"event_id": e.EventID.String()}}
		}
		failed, err := pub.PublishBatch(context.Background(), msgs)
		if err != nil || len(failed) > 0 {
			t.Fatalf("batch %d: failed %v, err %v", b, failed, err)
		}
		most = max(most, senders(pub))
	}
	if most < 1 || most > 3 {
		t.Fatalf("%d senders after a batch, want the 2 slots' (a third may be starting as one finishes)", most)
	}
	deadline := time.Now().Add(5 * time.Second)
	for senders(pub) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d senders still running 5s after the last batch, with an idle time of 200ms", senders(pub))
		}
		time.Sleep(20 * time.Millisecond)
	}
}
