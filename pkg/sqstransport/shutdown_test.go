package sqstransport_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/effectively-once/payments-cashback/internal/testenv"
	"github.com/effectively-once/payments-cashback/pkg/sqstransport"
)

// A handler that commits just as the shutdown grace runs out (here: it
// returns nil once its context is cancelled, as one whose COMMIT was
// already on its way would) has its message deleted: the final deletes are
// sent on a context of their own. They used to go out on the handlers'
// context, which the end of the grace cancels, so the delete failed and
// the message came back once more (deduplicated, but redelivered).
func TestAMessageCommittedAtTheEndOfTheShutdownGraceIsDeleted(t *testing.T) {
	t.Parallel()
	c := testenv.SQS(t)
	q, _ := testenv.Queue(t, c, 5, 30*time.Second)
	started := make(chan struct{}, 1)
	h := func(ctx context.Context, _ sqstransport.Delivery) error {
		started <- struct{}{}
		<-ctx.Done() // the grace is over
		return nil   // the effect committed meanwhile
	}
	cfg := testConfig(q)
	cfg.ShutdownGrace = 300 * time.Millisecond
	cfg.Visibility = 30 * time.Second
	r := start(t, c, cfg, h)
	send(t, c, q, newEvent(t, 1))
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("the handler was never called")
	}
	if err := r.stop(t, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if visible, inflight := depth(t, c, q); visible+inflight != 0 {
		t.Fatalf("queue holds %d visible and %d in flight after Run returned; want the committed message deleted", visible, inflight)
	}
}

// A receive whose answer never comes (a stalled connection, a proxy that
// accepted the request and hangs) is cut a little after WaitTime: it is
// logged as a failed receive and retried after the back-off, and on
// shutdown Run returns once that deadline has passed. The receive had no
// deadline of its own and the SDK's HTTP client has no response timeout,
// so such a receive hung silently and Run never returned, although the
// drain promises to wait for the current long poll only.
func TestAReceiveThatNeverAnswersIsCutAfterWaitTimeAndDoesNotHoldShutdown(t *testing.T) {
	t.Parallel()
	hang := make(chan struct{})
	rp := &sqsReplay{on: map[string]func(http.ResponseWriter, map[string]any){
		"ReceiveMessage": func(http.ResponseWriter, map[string]any) { <-hang },
	}}
	srv := httptest.NewServer(rp)
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(hang) }) // runs before srv.Close
	logs := &testenv.Buffer{}
	s, err := sqstransport.NewSubscriber(replayClient(srv), sqstransport.SubscriberConfig{
		QueueURL: replayDest, DLQURL: replayDLQ, WaitTime: time.Second, ShutdownGrace: time.Second,
		Logger: slog.New(slog.NewJSONHandler(logs, nil)),
	}, func(context.Context, sqstransport.Delivery) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	sqstransport.SetCallTimeout(s, 200*time.Millisecond) // the receive's deadline: WaitTime + 200ms
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	waitFor(t, 5*time.Second, "the hung receive logged as failed", func() bool {
		return strings.Contains(logs.String(), `"msg":"receive failed"`) && strings.Contains(logs.String(), "deadline exceeded")
	})
	waitFor(t, 5*time.Second, "the receive retried after the back-off", func() bool { return rp.count("ReceiveMessage") >= 2 })
	t0 := time.Now()
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
		if d := time.Since(t0); d > 2*time.Second {
			t.Errorf("Run returned %v after cancel, want within the receive's deadline (1.2s)", d)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return 10s after cancel, with WaitTime 1s and ShutdownGrace 1s: the receive hangs without a deadline")
	}
}
