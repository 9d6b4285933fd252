package sqstransport_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/smithy-go/middleware"

	"github.com/effectively-once/payments-cashback/internal/testenv"
	"github.com/effectively-once/payments-cashback/pkg/sqstransport"
)

// recordVisibility records the VisibilityTimeout of every
// ChangeMessageVisibility call a client makes, and its error.
func recordVisibility(mu *sync.Mutex, got *[]int32, errs *[]error) func(*middleware.Stack) error {
	return func(stack *middleware.Stack) error {
		return stack.Initialize.Add(middleware.InitializeMiddlewareFunc("recordVisibility",
			func(ctx context.Context, in middleware.InitializeInput, next middleware.InitializeHandler) (middleware.InitializeOutput, middleware.Metadata, error) {
				out, md, err := next.HandleInitialize(ctx, in)
				if p, ok := in.Parameters.(*sqs.ChangeMessageVisibilityInput); ok {
					mu.Lock()
					*got, *errs = append(*got, p.VisibilityTimeout), append(*errs, err)
					mu.Unlock()
				}
				return out, md, err
			}), middleware.After)
	}
}

// A retry delay beyond SQS's 12-hour limit, set in code, hides the failed
// message until just before 12 hours from its receive, the most SQS lets
// a message stay in flight (the limit counts from the receive): the call
// SQS would refuse, leaving the message to come back after its visibility
// timeout instead, is never made.
func TestARetryDelayAboveTwelveHoursEndsWithinTheInFlightLimit(t *testing.T) {
	t.Parallel()
	c := testenv.SQS(t)
	q, _ := testenv.Queue(t, c, 5, 30*time.Second)
	var mu sync.Mutex
	var got []int32
	var errs []error
	rec := sqs.New(c.Options(), func(o *sqs.Options) { o.APIOptions = append(o.APIOptions, recordVisibility(&mu, &got, &errs)) })
	send(t, c, q, newEvent(t, 1))
	cfg := testConfig(q)
	cfg.RetryBase, cfg.RetryMax = 24*time.Hour, 48*time.Hour
	failed := make(chan struct{}, 1)
	start(t, rec, cfg, func(context.Context, sqstransport.Delivery) error {
		select {
		case failed <- struct{}{}:
		default:
		}
		return errors.New("transient")
	})
	select {
	case <-failed:
	case <-time.After(20 * time.Second):
		t.Fatal("the message was never handled")
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		mu.Lock()
		n := len(got)
		mu.Unlock()
		if n > 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	// 12 h less a minute, less the second or so since the receive.
	if len(got) == 0 || got[0] < 12*60*60-70 || got[0] > 12*60*60-60 || errs[0] != nil {
		t.Fatalf("ChangeMessageVisibility calls %v (errors %v); want one just under 43140 s, which SQS accepts", got, errs)
	}
}

// A visibility extension whose answer never comes is cut at its own
// deadline and logged, so the handler's success still deletes the message
// at once. The heartbeat's ChangeMessageVisibility had no deadline: the
// handler returned, stopping the heartbeat waited for the hung call, and
// the committed message was never deleted; it came back once its
// visibility ran out and was handled again.
func TestAHungVisibilityExtensionDoesNotHoldTheDeleteOfACommittedMessage(t *testing.T) {
	t.Parallel()
	c := testenv.SQS(t)
	q, _ := testenv.Queue(t, c, 5, 30*time.Second)
	target, err := url.Parse(testenv.SQSEndpoint(t))
	if err != nil {
		t.Fatal(err)
	}
	hang := make(chan struct{})
	rp := &sqsReplay{next: httputil.NewSingleHostReverseProxy(target), on: map[string]func(http.ResponseWriter, map[string]any){
		"ChangeMessageVisibility": func(http.ResponseWriter, map[string]any) { <-hang },
	}}
	srv := httptest.NewServer(rp)
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(hang) }) // runs before srv.Close
	var calls atomic.Int64
	logs := &testenv.Buffer{}
	cfg := testConfig(q)
	cfg.Visibility, cfg.HandlerTimeout = 2*time.Second, 1800*time.Millisecond // a heartbeat each second
	cfg.Logger = slog.New(slog.NewJSONHandler(logs, nil))
	s, err := sqstransport.NewSubscriber(replayClient(srv), cfg, func(context.Context, sqstransport.Delivery) error {
		calls.Add(1)
		time.Sleep(1300 * time.Millisecond) // past the first heartbeat
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sqstransport.SetCallTimeout(s, 300*time.Millisecond)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	send(t, c, q, newEvent(t, 1))
	waitFor(t, 10*time.Second, "the handler to run", func() bool { return calls.Load() > 0 })
	waitEmpty(t, c, q, 5*time.Second)
	if n := calls.Load(); n != 1 {
		t.Errorf("handler ran %d times, want 1: the committed message came back", n)
	}
	if l := logs.String(); !strings.Contains(l, `"msg":"change visibility failed"`) || !strings.Contains(l, "deadline exceeded") {
		t.Errorf("the hung extension was not logged as failed on its deadline:\n%s", l)
	}
}
