package idempotent_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/effectively-once/payments-cashback/internal/testenv"
	"github.com/effectively-once/payments-cashback/pkg/events"
	"github.com/effectively-once/payments-cashback/pkg/idempotent"
)

const crashChildEnv = "INBOX_CRASH_CHILD_DSN"

// The crash settings shared by the killed child and the parent.
var crashCfg = idempotent.ProcessorConfig{BatchSize: 1, ClaimHold: 300 * time.Millisecond, RetryBase: 300 * time.Millisecond,
	PollInterval: 10 * time.Millisecond}

// A processor process is SIGKILLed while its handler is inside the apply
// transaction, its effect written but not committed. The effect must vanish
// with the process, the attempt must stay counted, the row must come back
// by itself once the claim's backoff expires (no rescuer), and the key's
// next row must not overtake it.
func TestProcessorKilledMidClaim(t *testing.T) {
	t.Parallel()
	if dsn := os.Getenv(crashChildEnv); dsn != "" {
		crashChild(t, dsn)
		return
	}
	dsn := testenv.DatabaseURL(t)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if err := idempotent.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE applied (ordering_key text NOT NULL, version bigint NOT NULL,
		event_id uuid NOT NULL UNIQUE, seq bigserial)`); err != nil {
		t.Fatal(err)
	}
	in := newInbox(t, pool, "notifications", idempotent.InboxConfig{})
	v1, v2 := keyedEvent(t, "cb_a", 1), keyedEvent(t, "cb_a", 2)
	receive(t, in, v2)
	receive(t, in, v1)

	child := exec.Command(os.Args[0], "-test.run=^TestProcessorKilledMidClaim$", "-test.v")
	child.Env = append(os.Environ(), crashChildEnv+"="+dsn)
	out, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	child.Stderr = os.Stderr
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	inHandler := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if id, ok := strings.CutPrefix(sc.Text(), "IN_HANDLER "); ok {
				inHandler <- id
			}
		}
		close(inHandler)
	}()
	var claimed string
	select {
	case claimed = <-inHandler:
	case <-time.After(30 * time.Second):
		_ = child.Process.Kill()
		t.Fatal("child processor never reached its handler")
	}
	if claimed != v1.EventID.String() {
		t.Fatalf("child took %s, want the head v1 %s", claimed, v1.EventID)
	}
	// While the child holds the claim, its effect is invisible and v2 waits.
	if n := count(t, pool, `SELECT count(*) FROM applied`); n != 0 {
		t.Fatalf("uncommitted effect visible: %d rows", n)
	}
	if err := child.Process.Kill(); err != nil { // SIGKILL: no cleanup of any kind
		t.Fatal(err)
	}
	_ = child.Wait()

	r := inboxRow(t, pool, "notifications", v1.EventID)
	if r.Status != "PENDING" || r.Attempts != 1 {
		t.Fatalf("after the kill v1 is %+v, want PENDING with its attempt counted", r)
	}
	retryAt := r.NextAttemptAt
	if n := count(t, pool, `SELECT count(*) FROM applied`); n != 0 {
		t.Fatalf("the killed attempt left %d effect rows", n)
	}

	var firstV1Call atomic.Pointer[time.Time]
	h := func(ctx context.Context, tx pgx.Tx, e events.Envelope) error {
		if e.EventID == v1.EventID {
			now := time.Now()
			firstV1Call.CompareAndSwap(nil, &now)
		}
		return record(ctx, tx, e)
	}
	runProcessors(t, pool, in, h, crashCfg, 2)
	waitFor(t, 10*time.Second, "both rows DONE", func() bool {
		return count(t, pool, `SELECT count(*) FROM inbox WHERE status = 'DONE'`) == 2
	})
	if at := *firstV1Call.Load(); at.Before(retryAt.Add(-50 * time.Millisecond)) {
		t.Fatalf("v1 retried at %v, before its backoff expired at %v", at, retryAt)
	}
	if r := inboxRow(t, pool, "notifications", v1.EventID); r.Attempts != 2 {
		t.Fatalf("v1 attempts = %d, want 2 (the killed one and the one that committed)", r.Attempts)
	}
	if vs := appliedVersions(t, pool)["cb_a"]; !slices.Equal(vs, []int64{1, 2}) {
		t.Fatalf("applied %v, want [1 2] exactly once each and in order across the crash", vs)
	}
}

// crashChild is the process TestProcessorKilledMidClaim kills: it writes
// the effect, says where it is, and hangs inside the apply transaction.
func crashChild(t *testing.T, dsn string) {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	in, err := idempotent.NewInbox(pool, "notifications", idempotent.InboxConfig{})
	if err != nil {
		t.Fatal(err)
	}
	p, err := in.NewProcessor(func(ctx context.Context, tx pgx.Tx, e events.Envelope) error {
		if err := record(ctx, tx, e); err != nil {
			return err
		}
		fmt.Printf("IN_HANDLER %s\n", e.EventID)
		select {} // the parent kills us here
	}, crashCfg)
	if err != nil {
		t.Fatal(err)
	}
	_ = p.Run(ctx)
}

// A handler whose connection dies (here: it terminates its own backend)
// never finishes its attempt. Each such attempt still counts, so a message
// that keeps killing its connection ends FAILED instead of looping forever,
// with what killed it as its last error.
func TestProcessorLostConnectionsCountAndEndFailed(t *testing.T) {
	t.Parallel()
	pool := inboxSetup(t)
	in := newInbox(t, pool, "notifications", idempotent.InboxConfig{})
	e := keyedEvent(t, "cb_1", 1)
	receive(t, in, e)
	var calls atomic.Int64
	h := func(ctx context.Context, tx pgx.Tx, e events.Envelope) error {
		calls.Add(1)
		if err := record(ctx, tx, e); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `SELECT pg_terminate_backend(pg_backend_pid())`)
		return err
	}
	runProcessors(t, pool, in, h, idempotent.ProcessorConfig{MaxAttempts: 2, ClaimHold: 20 * time.Millisecond,
		RetryBase: 20 * time.Millisecond, PollInterval: 10 * time.Millisecond}, 1)
	waitFor(t, 10*time.Second, "row FAILED", func() bool { return inboxRow(t, pool, "notifications", e.EventID).Status == "FAILED" })
	r := inboxRow(t, pool, "notifications", e.EventID)
	if r.Attempts != 2 || calls.Load() != 2 || r.LastError == nil || !strings.Contains(*r.LastError, "terminating connection") {
		t.Fatalf("row %+v (%v) after %d calls; want FAILED after 2 attempts, naming the terminated connection", r, r.LastError, calls.Load())
	}
	if n := count(t, pool, `SELECT count(*) FROM applied`); n != 0 {
		t.Fatalf("%d effect rows committed by attempts that never finished", n)
	}
}

// A handler much slower than the claim's backoff is not run a second time
// by the other processors that see its row due again: the row lock of the
// running attempt keeps them off.
func TestProcessorNeverRunsSlowWorkTwice(t *testing.T) {
	t.Parallel()
	pool := inboxSetup(t)
	in := newInbox(t, pool, "notifications", idempotent.InboxConfig{})
	e := keyedEvent(t, "cb_1", 1)
	receive(t, in, e)
	var calls atomic.Int64
	h := func(ctx context.Context, tx pgx.Tx, e events.Envelope) error {
		calls.Add(1)
		time.Sleep(time.Second) // 25x the claim's hold below
		return record(ctx, tx, e)
	}
	runProcessors(t, pool, in, h, idempotent.ProcessorConfig{ClaimHold: 40 * time.Millisecond,
		RetryBase: 40 * time.Millisecond, PollInterval: 5 * time.Millisecond}, 3)
	waitFor(t, 10*time.Second, "row DONE", func() bool { return inboxRow(t, pool, "notifications", e.EventID).Status == "DONE" })
	time.Sleep(100 * time.Millisecond)
	// (attempts may read 2 on a loaded machine: a claim can be taken over
	// before its handler starts; what must never happen is a second run.)
	if calls.Load() != 1 {
		t.Fatalf("handler ran %d times, want once", calls.Load())
	}
}

// Cancelling Run lets the batch in progress commit instead of wasting it.
func TestProcessorShutdownFinishesTheBatchInProgress(t *testing.T) {
	t.Parallel()
	pool := inboxSetup(t)
	in := newInbox(t, pool, "notifications", idempotent.InboxConfig{})
	e := keyedEvent(t, "cb_1", 1)
	receive(t, in, e)
	started := make(chan struct{})
	p, err := in.NewProcessor(func(ctx context.Context, tx pgx.Tx, e events.Envelope) error {
		close(started)
		time.Sleep(300 * time.Millisecond)
		return record(ctx, tx, e)
	}, idempotent.ProcessorConfig{PollInterval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = p.Run(ctx); close(done) }()
	<-started
	cancel()
	<-done
	if r := inboxRow(t, pool, "notifications", e.EventID); r.Status != "DONE" {
		t.Fatalf("row %s after a clean shutdown, want DONE", r.Status)
	}
}

// A handler cannot end the processor's transaction behind its back.
func TestProcessorHandlerCannotCommitItsTransaction(t *testing.T) {
	t.Parallel()
	pool := inboxSetup(t)
	in := newInbox(t, pool, "notifications", idempotent.InboxConfig{})
	e := keyedEvent(t, "cb_1", 1)
	receive(t, in, e)
	var commitErr, rollbackErr error
	p, err := in.NewProcessor(func(ctx context.Context, tx pgx.Tx, e events.Envelope) error {
		if err := record(ctx, tx, e); err != nil {
			return err
		}
		commitErr, rollbackErr = tx.Commit(ctx), tx.Rollback(ctx)
		return nil
	}, idempotent.ProcessorConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := p.ProcessOnce(context.Background()); n != 1 || err != nil {
		t.Fatalf("ProcessOnce = %d, %v", n, err)
	}
	if commitErr == nil || rollbackErr == nil {
		t.Fatalf("handler's Commit/Rollback returned %v/%v, want errors", commitErr, rollbackErr)
	}
	if r := inboxRow(t, pool, "notifications", e.EventID); r.Status != "DONE" || count(t, pool, `SELECT count(*) FROM applied`) != 1 {
		t.Fatalf("row %s, want DONE with its effect", r.Status)
	}
}

// Workers that would hold every connection of the receiving pool are
// refused: slow handlers would then stop Receive, and with it every ack.
func TestProcessorRefusesToStarveTheReceiver(t *testing.T) {
	t.Parallel()
	pool := inboxSetup(t) // MaxConns 4 (pgxpool's default on small machines)
	in := newInbox(t, pool, "notifications", idempotent.InboxConfig{})
	conns := int(pool.Config().MaxConns)
	if _, err := in.NewProcessor(record, idempotent.ProcessorConfig{Workers: conns - 1}); err != nil {
		t.Fatalf("%d workers on %d connections: %v", conns-1, conns, err)
	}
	if _, err := in.NewProcessor(record, idempotent.ProcessorConfig{Workers: 1}); err == nil {
		t.Fatal("a processor that takes the receiver's last connection was accepted")
	}
	if _, err := in.NewProcessor(record, idempotent.ProcessorConfig{Workers: 8, Pool: otherPool(t, pool, 9)}); err != nil {
		t.Fatalf("own pool: %v", err)
	}
}

// A hung handler is cut at HandlerTimeout: its row's work rolls back (the
// row and key locks are released), the row goes back to PENDING with the
// deadline as its last error and is retried, and the timeout is counted.
func TestProcessorCutsAHungHandlerAtItsDeadline(t *testing.T) {
	t.Parallel()
	pool := inboxSetup(t)
	m := newMetrics()
	in := newInbox(t, pool, "notifications", idempotent.InboxConfig{MeterProvider: m.Provider})
	e := keyedEvent(t, "cb_1", 1)
	receive(t, in, e)
	var calls atomic.Int64
	h := func(ctx context.Context, tx pgx.Tx, e events.Envelope) error {
		if err := record(ctx, tx, e); err != nil {
			return err
		}
		if calls.Add(1) == 1 {
			<-ctx.Done() // an external call that never answers
			return ctx.Err()
		}
		return nil
	}
	runProcessors(t, pool, in, h, idempotent.ProcessorConfig{HandlerTimeout: 300 * time.Millisecond,
		ClaimHold: 100 * time.Millisecond, RetryBase: 100 * time.Millisecond, PollInterval: 10 * time.Millisecond}, 1)
	waitFor(t, 10*time.Second, "the row DONE", func() bool { return inboxRow(t, pool, "notifications", e.EventID).Status == "DONE" })
	r := inboxRow(t, pool, "notifications", e.EventID)
	if r.Attempts != 2 || r.LastError == nil || !strings.Contains(*r.LastError, "deadline") {
		t.Fatalf("row %+v; want DONE at attempt 2, the deadline kept as last error", r)
	}
	if n := count(t, pool, `SELECT count(*) FROM applied`); n != 1 {
		t.Fatalf("%d effect rows, want 1: the cut attempt's writes roll back", n)
	}
	if got := m.Value(t, "inbox_handler_timeouts_total", "consumer", "notifications"); got != 1 {
		t.Fatalf("inbox_handler_timeouts_total = %v, want 1", got)
	}
}

// The claim's commit does not wait for its WAL flush (the apply's commit,
// later in the WAL, flushes it), while the apply transaction, which holds
// the effect and the DONE mark, commits with the server's
// synchronous_commit: the effect is as durable as any other commit.
func TestProcessorClaimCommitsAsynchronouslyTheEffectDoesNot(t *testing.T) {
	t.Parallel()
	pool := inboxSetup(t)
	ctx := context.Background()
	in := newInbox(t, pool, "notifications", idempotent.InboxConfig{})
	receive(t, in, keyedEvent(t, "cb_1", 1))
	var inHandler string
	p, err := in.NewProcessor(func(ctx context.Context, tx pgx.Tx, e events.Envelope) error {
		if err := tx.QueryRow(ctx, `SELECT current_setting('synchronous_commit')`).Scan(&inHandler); err != nil {
			return err
		}
		return record(ctx, tx, e)
	}, idempotent.ProcessorConfig{})
	if err != nil {
		t.Fatal(err)
	}

	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	n, err := p.ClaimIn(ctx, tx)
	if err != nil || n != 1 {
		t.Fatalf("claim = %d, %v; want 1 row", n, err)
	}
	var inClaim string
	if err := tx.QueryRow(ctx, `SELECT current_setting('synchronous_commit')`).Scan(&inClaim); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if inClaim != "off" {
		t.Fatalf("synchronous_commit after the claim statement = %q, want off", inClaim)
	}

	if n, err := p.ProcessOnce(ctx); n != 1 || err != nil {
		t.Fatalf("ProcessOnce = %d, %v", n, err)
	}
	var server string
	if err := pool.QueryRow(ctx, `SELECT current_setting('synchronous_commit')`).Scan(&server); err != nil {
		t.Fatal(err)
	}
	if inHandler != server {
		t.Fatalf("synchronous_commit in the handler's transaction = %q, want the server's %q", inHandler, server)
	}
	if count(t, pool, `SELECT count(*) FROM applied`) != 1 {
		t.Fatal("the effect was not applied")
	}
}

// AfterCommit hears of each batch once it has committed, with the ids of
// the rows it applied: at that moment another session already sees their
// effects. A row whose handler failed is not among them.
func TestProcessorAfterCommitNamesTheAppliedRowsOnceTheyAreCommitted(t *testing.T) {
	t.Parallel()
	pool := inboxSetup(t)
	in := newInbox(t, pool, "notifications", idempotent.InboxConfig{})
	good := []events.Envelope{keyedEvent(t, "k_1", 1), keyedEvent(t, "k_2", 1), keyedEvent(t, "k_3", 1)}
	bad := keyedEvent(t, "k_bad", 1)
	for _, e := range append(good, bad) {
		receive(t, in, e)
	}
	var mu sync.Mutex
	heard := map[uuid.UUID]int{}
	var invisible []uuid.UUID
	h := func(ctx context.Context, tx pgx.Tx, e events.Envelope) error {
		if e.EventID == bad.EventID {
			return errors.New("refused")
		}
		return record(ctx, tx, e)
	}
	runProcessors(t, pool, in, h, idempotent.ProcessorConfig{PollInterval: 10 * time.Millisecond, RetryBase: time.Hour,
		AfterCommit: func(ids []uuid.UUID) {
			for _, id := range ids {
				var n int
				if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM applied WHERE event_id = $1`, id).Scan(&n); err != nil || n != 1 {
					mu.Lock()
					invisible = append(invisible, id)
					mu.Unlock()
				}
			}
			mu.Lock()
			for _, id := range ids {
				heard[id]++
			}
			mu.Unlock()
		}}, 1)
	waitFor(t, 10*time.Second, "the good rows DONE", func() bool {
		for _, e := range good {
			if inboxRow(t, pool, "notifications", e.EventID).Status != "DONE" {
				return false
			}
		}
		return true
	})
	time.Sleep(100 * time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	for _, e := range good {
		if heard[e.EventID] != 1 {
			t.Errorf("AfterCommit named %s %d times, want once", e.EventID, heard[e.EventID])
		}
	}
	if heard[bad.EventID] != 0 {
		t.Errorf("AfterCommit named the row whose handler failed")
	}
	if len(invisible) > 0 {
		t.Errorf("AfterCommit named %v before their effects were visible", invisible)
	}
}
