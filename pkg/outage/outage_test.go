package outage_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/effectively-once/payments-cashback/internal/faults"
	"github.com/effectively-once/payments-cashback/internal/testenv"
	"github.com/effectively-once/payments-cashback/pkg/outage"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// viaProxy is a pool on a fresh database through a proxy the test can cut.
func viaProxy(t *testing.T) (*pgxpool.Pool, *pgxpool.Pool, *faults.Proxy) {
	t.Helper()
	direct := testenv.DB(t)
	fx := faults.New()
	t.Cleanup(fx.Close)
	via, px, err := fx.Postgres(context.Background(), "db", direct)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(via.Close)
	return via, direct, px
}

// The errors PostgreSQL and the network really produce are classified: an
// unreachable server, a connection dropped mid-query, a pool acquire that
// runs out of time and an administrator's shutdown are outages; a
// constraint violation, a syntax error, a shutdown of our own (Canceled)
// and a plain error are not.
func TestUnavailableTellsTheDatabaseBeingAwayFromTheRequestBeingWrong(t *testing.T) {
	ctx := context.Background()
	via, direct, px := viaProxy(t)
	if _, err := via.Exec(ctx, `CREATE TABLE k (id int PRIMARY KEY); INSERT INTO k VALUES (1)`); err != nil {
		t.Fatal(err)
	}
	_, dup := via.Exec(ctx, `INSERT INTO k VALUES (1)`)
	_, syntax := via.Exec(ctx, `INSERT INTO`)

	// A query in flight when the connection goes.
	midQuery := make(chan error, 1)
	go func() { _, err := via.Exec(ctx, `SELECT pg_sleep(5)`); midQuery <- err }()
	time.Sleep(300 * time.Millisecond)
	px.Cut()
	dropped := <-midQuery
	_, refused := via.Exec(ctx, `SELECT 1`)

	// A pool with no free connection, whose acquire times out.
	if err := px.Restore(); err != nil {
		t.Fatal(err)
	}
	one := direct.Config().Copy()
	one.MaxConns = 1
	small, err := pgxpool.NewWithConfig(ctx, one)
	if err != nil {
		t.Fatal(err)
	}
	defer small.Close()
	held, err := small.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	actx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	_, acquire := small.Acquire(actx)
	cancel()
	held.Release()

	// 57P01: the server terminates our backend, as on a restart.
	conn, err := small.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var pid int
	if err := conn.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	if _, err := direct.Exec(ctx, `SELECT pg_terminate_backend($1)`, pid); err != nil {
		t.Fatal(err)
	}
	_, terminated := conn.Exec(ctx, `SELECT 1`)
	conn.Release()

	for _, c := range []struct {
		name string
		err  error
		want bool
	}{
		{"connection refused", refused, true},
		{"connection dropped mid-query", dropped, true},
		{"pool acquire timed out", acquire, true},
		{"backend terminated", terminated, true},
		{"wrapped outage", fmt.Errorf("cashback: %w", refused), true},
		{"unique violation", dup, false},
		{"syntax error", syntax, false},
		{"our own shutdown", context.Canceled, false},
		{"a plain error", errors.New("amount_paise: must be > 0"), false},
		{"nil", nil, false},
	} {
		if c.err == nil && c.name != "nil" {
			t.Fatalf("%s: the scenario produced no error", c.name)
		}
		if got := outage.Unavailable(c.err); got != c.want {
			t.Errorf("Unavailable(%s: %v) = %v, want %v", c.name, c.err, got, c.want)
		}
	}
}

// A gate closes only when a probe confirms the outage, reports not-ready
// while closed without leaking the driver's error text, and reopens as soon
// as a probe succeeds again; a nil gate is always open.
func TestAGateClosesOnAConfirmedOutageAndReopensWhenTheDatabaseAnswers(t *testing.T) {
	ctx := context.Background()
	via, _, px := viaProxy(t)
	var probes atomic.Int64
	g, err := outage.NewGate(outage.GateConfig{Name: "database", ProbeBase: 20 * time.Millisecond, ProbeMax: 100 * time.Millisecond,
		Probe: func(ctx context.Context) error { probes.Add(1); return via.Ping(ctx) }})
	if err != nil {
		t.Fatal(err)
	}
	if g.Suspect(ctx, context.DeadlineExceeded) {
		t.Fatal("a timeout with the database answering was called an outage")
	}
	if g.Closed() || probes.Load() != 1 {
		t.Fatalf("closed=%v after %d probes; want open after 1", g.Closed(), probes.Load())
	}
	if g.Suspect(ctx, errors.New("bad payload")) || probes.Load() != 1 {
		t.Fatal("an error that is not Unavailable was probed or called an outage")
	}

	px.Cut()
	_, err = via.Exec(ctx, `SELECT 1`)
	if !g.Suspect(ctx, err) || !g.Closed() {
		t.Fatalf("a refused connection with the database away did not close the gate (%v)", err)
	}
	cerr := g.Check(ctx)
	if cerr == nil {
		t.Fatal("readiness passes while the gate is closed")
	}
	if s := cerr.Error(); s == "" || contains(s, "127.0.0.1") || contains(s, "dial") {
		t.Fatalf("readiness error %q leaks the driver's error text", s)
	}
	wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	if err := g.Wait(wctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait during the outage returned %v, want the context's deadline", err)
	}
	cancel()
	before := probes.Load()
	if err := px.Restore(); err != nil {
		t.Fatal(err)
	}
	wctx, cancel = context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := g.Wait(wctx); err != nil {
		t.Fatalf("Wait after the database came back: %v", err)
	}
	if g.Closed() || g.Check(ctx) != nil || probes.Load() <= before {
		t.Fatal("the gate did not reopen through a probe")
	}

	var none *outage.Gate
	if none.Suspect(ctx, err) || none.Closed() || none.Wait(ctx) != nil || none.Check(ctx) != nil {
		t.Fatal("a nil gate must be open and suspect nothing")
	}
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }
