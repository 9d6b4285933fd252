package sqstransport_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/effectively-once/payments-cashback/internal/faults"
	"github.com/effectively-once/payments-cashback/internal/testenv"
	"github.com/effectively-once/payments-cashback/pkg/events"
	"github.com/effectively-once/payments-cashback/pkg/outage"
	"github.com/effectively-once/payments-cashback/pkg/sqstransport"
)

// proxiedDB is a fresh database reached through a Toxiproxy proxy the test
// can cut: the pool returned goes through it, direct does not.
func proxiedDB(t *testing.T) (via, direct *pgxpool.Pool, px *faults.Proxy) {
	t.Helper()
	direct = testenv.DB(t)
	fx := faults.New()
	t.Cleanup(fx.Close)
	via, px, err := fx.Postgres(context.Background(), "db-"+t.Name(), direct)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(via.Close)
	if _, err := direct.Exec(context.Background(), `CREATE TABLE applied (event_id uuid PRIMARY KEY, receives int NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return via, direct, px
}

// applyOnce is a handler whose effect is one row per event, written on db.
func applyOnce(db *pgxpool.Pool) sqstransport.Handler {
	return func(ctx context.Context, d sqstransport.Delivery) error {
		_, err := db.Exec(ctx, `INSERT INTO applied VALUES ($1, $2) ON CONFLICT DO NOTHING`, d.Envelope.EventID, d.ReceiveCount)
		return err
	}
}

func gate(t *testing.T, db *pgxpool.Pool) *outage.Gate {
	return probedGate(t, outage.GateConfig{Probe: db.Ping, ProbeTimeout: time.Second, ProbeMax: 500 * time.Millisecond})
}

// probedGate is a gate named "database", probed every 50 ms at first.
func probedGate(t *testing.T, cfg outage.GateConfig) *outage.Gate {
	t.Helper()
	cfg.Name, cfg.ProbeBase = "database", 50*time.Millisecond
	g, err := outage.NewGate(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// A database outage several times longer than SQS needs to dead-letter a
// failing message (here 0.1+0.2+0.4+0.4 s of backoff to the 5th receive)
// moves nothing to the DLQ: the subscriber stops receiving and holds what
// it has, readiness says why, and every message is applied once the
// database is back, most of them on their first receive.
func TestADatabaseOutageLongerThanTheRedeliveryScheduleDeadLettersNothing(t *testing.T) {
	t.Parallel()
	c := testenv.SQS(t)
	q, dlq := testenv.Queue(t, c, 5, 2*time.Second)
	via, direct, px := proxiedDB(t)
	g := gate(t, via)
	cfg := testConfig(q)
	cfg.DLQURL, cfg.Gate, cfg.RetryBase, cfg.RetryMax, cfg.Visibility = dlq, g, 100*time.Millisecond, 400*time.Millisecond, 2*time.Second
	start(t, c, cfg, applyOnce(via))

	const n = 40
	px.Cut()
	for i := range n {
		send(t, c, q, newEvent(t, i))
	}
	waitFor(t, 10*time.Second, "the gate to close", g.Closed)
	if err := g.Check(context.Background()); err == nil {
		t.Fatal("readiness passes during the outage; want it to fail")
	}
	time.Sleep(4 * time.Second) // > 3 times the dead-letter schedule
	if v, _ := depth(t, c, dlq); v != 0 {
		t.Fatalf("%d messages in the DLQ during the outage; want 0", v)
	}
	if err := px.Restore(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "every message applied", func() bool {
		return countRows(t, direct, `SELECT count(*) FROM applied`) == n
	})
	waitEmpty(t, c, q, 10*time.Second)
	if v, i := depth(t, c, dlq); v+i != 0 {
		t.Fatalf("%d messages in the DLQ after the outage; want 0", v+i)
	}
	if g.Closed() || g.Check(context.Background()) != nil {
		t.Fatal("the gate is still closed after the database came back")
	}
	worst := countRows(t, direct, `SELECT max(receives) FROM applied`)
	t.Logf("%d messages applied after a 4 s outage; most receives any needed: %d", n, worst)
	if worst > 2 {
		t.Fatalf("a message needed %d receives; an outage should cost at most one", worst)
	}
}

// The gate only holds back outages: a message whose handler fails while the
// database answers (here a deadline that runs out, which looks like an
// outage until the probe says otherwise) still reaches the DLQ after
// maxReceiveCount receives, and the messages around it are applied.
func TestAMessageFailingWhileTheDatabaseAnswersStillReachesTheDLQ(t *testing.T) {
	t.Parallel()
	c := testenv.SQS(t)
	q, dlq := testenv.Queue(t, c, 3, 2*time.Second)
	via, direct, _ := proxiedDB(t)
	g := gate(t, via)
	bad := newEvent(t, 999)
	cfg := testConfig(q)
	cfg.DLQURL, cfg.Gate, cfg.RetryBase, cfg.RetryMax = dlq, g, 100*time.Millisecond, 200*time.Millisecond
	apply := applyOnce(via)
	start(t, c, cfg, func(ctx context.Context, d sqstransport.Delivery) error {
		if d.Envelope.EventID == bad.EventID {
			return fmt.Errorf("slow query: %w", context.DeadlineExceeded)
		}
		return apply(ctx, d)
	})
	send(t, c, q, bad)
	for i := range 5 {
		send(t, c, q, newEvent(t, i))
	}
	waitFor(t, 30*time.Second, "the failing message to reach the DLQ", func() bool { v, _ := depth(t, c, dlq); return v == 1 })
	waitFor(t, 30*time.Second, "the 5 healthy messages applied", func() bool {
		return countRows(t, direct, `SELECT count(*) FROM applied`) == 5
	})
	if g.Closed() {
		t.Fatal("the gate closed although the database answered")
	}
}

func countRows(t testing.TB, db *pgxpool.Pool, sql string) int64 {
	t.Helper()
	var n *int64
	if err := db.QueryRow(context.Background(), sql).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n == nil {
		return 0
	}
	return *n
}

// dependency is a stand-in for a handler's database that the test takes
// down and brings back: its probe and its calls fail with a refused
// connection while it is down.
type dependency struct {
	mu   sync.Mutex
	down bool
}

func (d *dependency) set(down bool) { d.mu.Lock(); d.down = down; d.mu.Unlock() }

func (d *dependency) call(context.Context) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.down {
		return fmt.Errorf("insert: %w", syscall.ECONNREFUSED)
	}
	return nil
}

func (d *dependency) gate(t *testing.T) *outage.Gate {
	return probedGate(t, outage.GateConfig{Probe: d.call, ProbeMax: 200 * time.Millisecond})
}

// A subscriber whose every slot is busy when the gate closes receives
// nothing until it reopens: the message behind the held one is received
// once the outage is over, on its first receive. Run looked at the gate
// only before waiting for a free slot, so when the held message was let
// go (MaxExtension) it received the next one with the gate closed, and
// that receive was spent on the outage, towards maxReceiveCount.
func TestASlotFreedDuringAnOutageReceivesNothingUntilTheGateReopens(t *testing.T) {
	t.Parallel()
	c := testenv.SQS(t)
	q, dlq := testenv.Queue(t, c, 5, 30*time.Second)
	db := &dependency{down: true}
	g := db.gate(t)
	type call struct {
		receive int
		closed  bool // the gate was closed when the message was handed over
	}
	var mu sync.Mutex
	calls := map[string][]call{}
	h := func(ctx context.Context, d sqstransport.Delivery) error {
		mu.Lock()
		calls[d.Envelope.EventID.String()] = append(calls[d.Envelope.EventID.String()], call{d.ReceiveCount, g.Closed()})
		mu.Unlock()
		return db.call(ctx)
	}
	cfg := testConfig(q)
	cfg.DLQURL, cfg.Gate, cfg.Concurrency = dlq, g, 1
	cfg.Visibility, cfg.MaxExtension = 2*time.Second, time.Second
	start(t, c, cfg, h)
	held, next := newEvent(t, 1), newEvent(t, 2)
	send(t, c, q, held)
	waitFor(t, 10*time.Second, "the gate to close", g.Closed)
	send(t, c, q, next)
	time.Sleep(2500 * time.Millisecond) // the held message let go at MaxExtension, its slot free
	db.set(false)
	waitEmpty(t, c, q, 15*time.Second)
	mu.Lock()
	defer mu.Unlock()
	t.Logf("calls: %+v", calls)
	for id, cs := range calls {
		for _, cl := range cs {
			if cl.closed {
				t.Errorf("message %s handed over on receive %d while the gate was closed", id, cl.receive)
			}
		}
	}
	if cs := calls[next.EventID.String()]; len(cs) != 1 || cs[0].receive != 1 {
		t.Errorf("the message sent during the outage was handed over as %+v, want once, on its first receive", cs)
	}
}

// A receive whose batch call failed one message on its own fault and
// another on a refused connection is held as an outage: the gate probes,
// closes, and once the dependency answers the receive is handed over again,
// each message applied on its first receive. Only the first transient
// error of the batch was shown to the gate; when it was the message's own,
// the outage went unrecognised and every message of the receive came
// back, each spending a receive towards maxReceiveCount.
func TestABatchIsHeldForAnOutageWhenALaterMessageFailedOnTheDependency(t *testing.T) {
	t.Parallel()
	c := testenv.SQS(t)
	q, dlq := testenv.Queue(t, c, 5, 30*time.Second)
	db := &dependency{down: true}
	g := db.gate(t)
	evs := []events.Envelope{newEvent(t, 1), newEvent(t, 2)}
	sendTogether(t, c, q, evs...)
	var mu sync.Mutex
	var sizes []int
	appliedAt := map[string]int{}
	h := func(ctx context.Context, ds []sqstransport.Delivery) []error {
		mu.Lock()
		defer mu.Unlock()
		sizes = append(sizes, len(ds))
		if len(sizes) == 1 {
			time.AfterFunc(time.Second, func() { db.set(false) }) // the outage ends a second later
			out := make([]error, len(ds))
			for i := range ds {
				out[i] = db.call(ctx) // the connection refused, but
			}
			out[0] = errors.New("amount out of range") // the first failed on its own
			return out
		}
		out := make([]error, len(ds))
		for i, d := range ds {
			if out[i] = db.call(ctx); out[i] == nil {
				appliedAt[d.Envelope.EventID.String()] = d.ReceiveCount
			}
		}
		return out
	}
	cfg := testConfig(q)
	cfg.DLQURL, cfg.Gate, cfg.Concurrency = dlq, g, 1
	runBatch(t, c, cfg, h)
	waitFor(t, 15*time.Second, "both messages applied", func() bool { mu.Lock(); defer mu.Unlock(); return len(appliedAt) == 2 })
	waitEmpty(t, c, q, 10*time.Second)
	mu.Lock()
	defer mu.Unlock()
	t.Logf("receive sizes %v, applied at %v", sizes, appliedAt)
	if sizes[0] != len(evs) {
		t.Skipf("SQS split the two messages over receives (sizes %v)", sizes)
	}
	for _, e := range evs {
		if n := appliedAt[e.EventID.String()]; n != 1 {
			t.Errorf("message %s applied on receive %d, want its first: the outage was not recognised", e.EventID, n)
		}
	}
	if n := counter(t, "sqs_handler_errors_total", queueName(q), ""); n != 0 {
		t.Errorf("sqs_handler_errors_total = %d, want 0: the receive was settled as failed instead of held", n)
	}
}
