package outbox_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/effectively-once/payments-cashback/pkg/outbox"
)

// listenConn LISTENs on the outbox channel on a connection of its own.
func listenConn(t *testing.T, pool *pgxpool.Pool) *pgx.Conn {
	t.Helper()
	conn, err := pgx.ConnectConfig(context.Background(), pool.Config().ConnConfig.Copy())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	if _, err := conn.Exec(context.Background(), "LISTEN "+outbox.Channel); err != nil {
		t.Fatal(err)
	}
	return conn
}

// notifications counts what conn receives within d.
func notifications(t *testing.T, conn *pgx.Conn, d time.Duration) int {
	t.Helper()
	n := 0
	deadline := time.Now().Add(d)
	for {
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		_, err := conn.WaitForNotification(ctx)
		cancel()
		if errors.Is(err, context.DeadlineExceeded) || (err != nil && time.Now().After(deadline)) {
			return n
		}
		if err != nil {
			t.Fatal(err)
		}
		n++
	}
}

// The producer's transaction notifies nobody: a commit with outbox rows
// sends no NOTIFY of its own (a NOTIFY inside a transaction serialises
// every notifying commit on the server). The wake-up is the Notifier's,
// sent after the commit from its own connection.
func TestAddSendsNoNotifyTheNotifierDoesAfterCommit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := setup(t)
	conn := listenConn(t, pool)
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return outbox.Add(ctx, tx, newEvent(t, 0)) })
	if err != nil {
		t.Fatal(err)
	}
	if n := notifications(t, conn, 300*time.Millisecond); n != 0 {
		t.Fatalf("the producer's commit sent %d notifications, want none", n)
	}
	nf := outbox.NewNotifier(pool, outbox.NotifierConfig{})
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- nf.Run(runCtx) }()
	t.Cleanup(func() { stop(); <-done })
	nf.Notify()
	if n := notifications(t, conn, 2*time.Second); n != 1 {
		t.Fatalf("after Notify: %d notifications, want 1", n)
	}
}

// Notify calls in a burst share NOTIFYs: at most one per MinInterval, and
// always one after the last call, so no commit's wake-up is lost.
func TestNotifierDebouncesAndSendsAfterTheLastCall(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	conn := listenConn(t, pool)
	nf := outbox.NewNotifier(pool, outbox.NotifierConfig{MinInterval: 50 * time.Millisecond})
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- nf.Run(ctx) }()
	t.Cleanup(func() { stop(); <-done })
	began := time.Now()
	for range 1000 {
		nf.Notify()
		time.Sleep(200 * time.Microsecond)
	}
	burst := time.Since(began)
	n := notifications(t, conn, burst+500*time.Millisecond)
	if most := int(burst/(50*time.Millisecond)) + 2; n < 1 || n > most {
		t.Fatalf("1000 Notify calls over %v: %d NOTIFYs, want 1..%d", burst, n, most)
	}
	var nilNotifier *outbox.Notifier
	nilNotifier.Notify() // a nil Notifier is inert: relays poll
}
