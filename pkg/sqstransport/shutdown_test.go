package sqstransport_test

import (
	"context"
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
