package outbox_test

import (
	"context"
	"errors"
	"log/slog"
	"maps"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"golang.org/x/sync/errgroup"

	"github.com/effectively-once/payments-cashback/internal/testenv"
	"github.com/effectively-once/payments-cashback/pkg/events"
	"github.com/effectively-once/payments-cashback/pkg/failpoint"
	"github.com/effectively-once/payments-cashback/pkg/idempotent"
	"github.com/effectively-once/payments-cashback/pkg/outbox"
)

// A relay that "crashes" after SQS accepted a batch and before marking it
// (its session ends without COMMIT) leaves the row unpublished and no
// longer claimed: another relay sends it again at once. The consumer
// receives two copies and applies one.
func TestCrashBetweenPublishAndMarkRepublishesAndConsumerAppliesOnce(t *testing.T) {
	ctx := context.Background()
	pool := setup(t)
	c, q, pub := queue(t)
	e := newEvent(t, 42)
	addCommitted(t, ctx, pool, e)

	crashing := newRelay(t, pool, pub, outbox.RelayConfig{})
	disable := failpoint.Enable(failpoint.AfterPublishBeforeMark, 1)
	n, err := crashing.RelayOnce(ctx)
	disable()
	if n != 1 || err == nil {
		t.Fatalf("RelayOnce at the failpoint: %d, %v; want 1 row and the crash error", n, err)
	}
	if s := state(t, pool, e.EventID); s.Published || s.Attempts != 0 {
		t.Fatalf("after the crash: %+v; want unpublished, nothing recorded", s)
	}

	rescuer := newRelay(t, pool, pub, outbox.RelayConfig{})
	if n, err := rescuer.RelayOnce(ctx); n != 1 || err != nil {
		t.Fatalf("second relay after the crash claimed %d (%v), want the row at once", n, err)
	}
	if got := count(t, pool, `SELECT count(*) FROM outbox WHERE published_at IS NOT NULL AND attempts = 1`); got != 1 {
		t.Fatalf("row not marked after the second send (attempts 1: the crashed send recorded nothing)")
	}

	copies := receive(t, c, q, 2, 10*time.Second, false)
	if len(copies) != 2 {
		t.Fatalf("received %d copies, want 2 (the crashed send and the resend)", len(copies))
	}
	if copies[0].MessageID == copies[1].MessageID {
		t.Fatalf("both copies have SQS MessageId %s, want two distinct sends", copies[0].MessageID)
	}

	// The consumer side, on its own database.
	cdb := testenv.DB(t)
	if err := idempotent.Migrate(ctx, cdb); err != nil {
		t.Fatal(err)
	}
	if _, err := cdb.Exec(ctx, `CREATE TABLE effects (event_id uuid NOT NULL, amount_paise bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	consumer, err := idempotent.NewConsumer(cdb, "rewards")
	if err != nil {
		t.Fatal(err)
	}
	var outcomes []idempotent.Outcome
	for _, m := range copies {
		env, err := events.Decode(m.Body)
		if err != nil {
			t.Fatal(err)
		}
		out, err := consumer.Handle(ctx, idempotent.MessageOf(env), func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO effects VALUES ($1, 2400)`, env.EventID)
			return err
		})
		if err != nil {
			t.Fatalf("Handle: %v", err)
		}
		if out.Done() {
			deleteAll(t, c, q, []received{m})
		}
		outcomes = append(outcomes, out)
	}
	if outcomes[0] != idempotent.Applied || outcomes[1] != idempotent.Duplicate {
		t.Fatalf("outcomes %v, want [applied duplicate]", outcomes)
	}
	if n := count(t, cdb, `SELECT count(*) FROM effects WHERE event_id = $1`, e.EventID); n != 1 {
		t.Fatalf("effect rows = %d, want 1 for 2 messages seen", n)
	}
}

// Four relays with two workers each, one pool each (as four processes
// would have), over 10,000 rows: every row is published and marked, the
// queue accepted each row exactly once across all replicas (counted at the
// publishers: no two replicas ever held one row, and no lease ran out
// mid-batch), consumers received each, and no relay logs an error (no
// serialization failures, no deadlocks).
func TestReplicasMarkEachRowExactlyOnce(t *testing.T) {
	t.Parallel()
	replicasPublishEachRowOnce(t, 10_000, outbox.RelayConfig{})
}

// The same with DeleteOnPublish, over fewer rows: each row is accepted by
// the queue exactly once, and then it is gone from the table.
func TestReplicasDeleteEachRowExactlyOnce(t *testing.T) {
	t.Parallel()
	replicasPublishEachRowOnce(t, 2_000, outbox.RelayConfig{DeleteOnPublish: true})
}

func replicasPublishEachRowOnce(t *testing.T, rows int, cfg outbox.RelayConfig) {
	const replicas = 4
	ctx := context.Background()
	pool := setup(t)
	c, q, pub := queue(t)

	ids := make(map[uuid.UUID]bool, rows)
	for batch := 0; batch < rows/500; batch++ {
		evs := make([]events.Envelope, 500)
		for i := range evs {
			evs[i] = newEvent(t, batch*500+i)
			ids[evs[i].EventID] = true
		}
		addCommitted(t, ctx, pool, evs...)
	}

	logs := &errorLog{}
	pubs := make([]*countingPublisher, replicas)
	for i := range replicas {
		pubs[i] = &countingPublisher{next: pub}
		c := cfg
		c.Workers, c.PollInterval, c.Logger = 2, 100*time.Millisecond, slog.New(logs)
		r := newRelay(t, replicaPool(t, pool), pubs[i], c)
		runRelay(t, r)
	}

	// Drain the queue with four receivers while the relays run.
	var mu sync.Mutex
	seen := make(map[uuid.UUID]int, rows)
	dctx, stopDrain := context.WithCancel(ctx)
	g, gctx := errgroup.WithContext(dctx)
	for range 4 {
		g.Go(func() error {
			for gctx.Err() == nil {
				msgs, err := receiveBatch(gctx, c, q, 1)
				if err != nil {
					if gctx.Err() != nil {
						return nil
					}
					return err
				}
				mu.Lock()
				for _, m := range msgs {
					seen[uuid.MustParse(m.Attributes["event_id"])]++
				}
				mu.Unlock()
				if err := deleteBatch(context.Background(), c, q, msgs); err != nil {
					return err
				}
			}
			return nil
		})
	}
	start := time.Now()
	waitFor(t, 2*time.Minute, "all rows marked and received", func() bool {
		mu.Lock()
		n := len(seen)
		mu.Unlock()
		return n == rows && count(t, pool, `SELECT count(*) FROM outbox WHERE published_at IS NULL`) == 0
	})
	elapsed := time.Since(start)
	stopDrain()
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	kept, wantKept := count(t, pool, `SELECT count(*) FROM outbox WHERE published_at IS NOT NULL`), int64(rows)
	if cfg.DeleteOnPublish {
		wantKept = 0
	}
	if left := count(t, pool, `SELECT count(*) FROM outbox`); kept != wantKept || left != wantKept {
		t.Errorf("outbox holds %d rows, %d of them marked published; want %d rows, all marked (DeleteOnPublish %v)", left, kept, wantKept, cfg.DeleteOnPublish)
	}

	accepted := make(map[uuid.UUID]int, rows)
	for _, p := range pubs {
		p.mu.Lock()
		for id, n := range p.accepted {
			accepted[id] += n
		}
		p.mu.Unlock()
	}
	var never, twice int
	for id := range ids {
		switch n := accepted[id]; {
		case n == 0:
			never++
		case n > 1:
			twice++
		}
	}
	if never != 0 || twice != 0 || len(accepted) != rows {
		t.Errorf("at the publishers: %d rows never accepted, %d accepted more than once, %d distinct ids (want 0, 0, %d)",
			never, twice, len(accepted), rows)
	}
	dups := 0
	for id := range ids {
		if seen[id] == 0 {
			t.Fatalf("event %s never received", id)
		}
		dups += seen[id] - 1
	}
	if len(seen) != rows {
		t.Errorf("received %d distinct ids, want %d", len(seen), rows)
	}
	total := 0
	for i, p := range pubs {
		p.mu.Lock()
		t.Logf("replica %d: %d PublishBatch calls, %d messages, largest batch %d", i, p.calls, p.sent, p.maxBatch)
		if p.maxBatch > 100 {
			t.Errorf("replica %d claimed %d rows at once, more than BatchSize 100", i, p.maxBatch)
		}
		total += p.sent
		p.mu.Unlock()
	}
	t.Logf("%d rows by %d replicas in %v (%.0f rows/s); %d sends, %d duplicate deliveries",
		rows, replicas, elapsed.Round(time.Millisecond), float64(rows)/elapsed.Seconds(), total, dups)
	for _, r := range logs.errors() {
		t.Errorf("relay logged an error: %s", r)
	}
}

// With LISTEN, a committed Add wakes a relay at once, long before its
// 10 s poll could fire.
func TestListenWakesRelay(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := setup(t)
	c, q, pub := queue(t)
	runRelay(t, newRelay(t, pool, pub, outbox.RelayConfig{PollInterval: 10 * time.Second}))
	waitFor(t, 10*time.Second, "the relay's LISTEN session", func() bool { return listeners(t, pool) == 1 })

	// Warm up: whatever the workers' first claim caught, they are all
	// asleep on their 10 s timer afterwards.
	addCommitted(t, ctx, pool, newEvent(t, 0))
	if got := receive(t, c, q, 1, 15*time.Second, true); len(got) != 1 {
		t.Fatalf("warm-up event not received")
	}
	time.Sleep(300 * time.Millisecond)

	e := newEvent(t, 1)
	addCommitted(t, ctx, pool, e)
	committed := time.Now()
	got := receive(t, c, q, 1, 8*time.Second, true)
	if len(got) != 1 || got[0].Attributes["event_id"] != e.EventID.String() {
		t.Fatalf("event not received within 8 s with LISTEN (poll interval 10 s): %v", got)
	}
	latency := got[0].At.Sub(committed)
	t.Logf("commit to receive with LISTEN: %v", latency)
	if latency >= 5*time.Second {
		t.Fatalf("latency %v: the notification did not wake the relay", latency)
	}
}

// Without LISTEN (PgBouncer in transaction mode), polling alone publishes.
func TestPollingWithoutListen(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := setup(t)
	c, q, pub := queue(t)
	runRelay(t, newRelay(t, pool, pub, outbox.RelayConfig{PollInterval: 200 * time.Millisecond, DisableListen: true}))
	time.Sleep(500 * time.Millisecond)
	if n := listeners(t, pool); n != 0 {
		t.Fatalf("%d LISTEN sessions with DisableListen", n)
	}
	e := newEvent(t, 1)
	addCommitted(t, ctx, pool, e)
	committed := time.Now()
	got := receive(t, c, q, 1, 8*time.Second, true)
	if len(got) != 1 || got[0].Attributes["event_id"] != e.EventID.String() {
		t.Fatalf("event not published by polling: %v", got)
	}
	latency := got[0].At.Sub(committed)
	t.Logf("commit to receive by polling every 200ms: %v", latency)
	if latency >= 5*time.Second {
		t.Fatalf("latency %v with a 200ms poll", latency)
	}
}

func listeners(t testing.TB, pool interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) int64 {
	t.Helper()
	var n int64
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
		WHERE datname = current_database() AND query = 'LISTEN outbox'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

var errInjected = errors.New("injected send failure")

// flakyPublisher fails chosen ids a chosen number of times, and optionally
// the first calls as a whole, before passing messages on.
type flakyPublisher struct {
	next      outbox.Publisher
	mu        sync.Mutex
	failIDs   map[uuid.UUID]int // remaining failures per id
	failCalls int               // remaining calls that fail as a whole
}

func (p *flakyPublisher) PublishBatch(ctx context.Context, msgs []outbox.Message) (map[uuid.UUID]error, error) {
	p.mu.Lock()
	if p.failCalls > 0 {
		p.failCalls--
		p.mu.Unlock()
		return nil, errInjected
	}
	failed := map[uuid.UUID]error{}
	var pass []outbox.Message
	for _, m := range msgs {
		if p.failIDs[m.EventID] > 0 {
			p.failIDs[m.EventID]--
			failed[m.EventID] = errInjected
			continue
		}
		pass = append(pass, m)
	}
	p.mu.Unlock()
	if len(pass) == 0 {
		return failed, nil
	}
	more, err := p.next.PublishBatch(ctx, pass)
	if err != nil {
		return nil, err
	}
	for id, err := range more {
		failed[id] = err
	}
	return failed, nil
}

type rowState struct {
	Attempts  int
	LastError *string
	Published bool
	Claimed   bool
	DueIn     time.Duration // next_attempt_at - clock_timestamp()
}

func state(t testing.TB, pool interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, id uuid.UUID) rowState {
	t.Helper()
	var s rowState
	var secs float64
	err := pool.QueryRow(context.Background(), `SELECT attempts, last_error, published_at IS NOT NULL, claimed_until IS NOT NULL,
		extract(epoch FROM next_attempt_at - clock_timestamp())::float8 FROM outbox WHERE id = $1`, id).
		Scan(&s.Attempts, &s.LastError, &s.Published, &s.Claimed, &secs)
	if err != nil {
		t.Fatal(err)
	}
	s.DueIn = time.Duration(secs * float64(time.Second))
	return s
}

// With DeleteOnPublish a row is deleted in its claim's transaction, and
// only once the queue accepted it: a crash between publish and delete
// leaves every row as it was (sent again, at least once); a failed send is
// rescheduled with backoff as in the default mode, and deleted once it is
// sent; a row marked published before the switch is left to the cleanup.
func TestDeleteOnPublishDeletesOnlyWhatTheQueueAccepted(t *testing.T) {
	ctx := context.Background()
	pool := setup(t)
	c, q, pub := queue(t)
	marked := newEvent(t, 0)
	addCommitted(t, ctx, pool, marked)
	if n, err := newRelay(t, pool, pub, outbox.RelayConfig{}).RelayOnce(ctx); n != 1 || err != nil {
		t.Fatalf("default relay: %d, %v; want the row published", n, err)
	}
	failing, fine := newEvent(t, 1), newEvent(t, 2)
	addCommitted(t, ctx, pool, failing, fine)
	cfg := outbox.RelayConfig{DeleteOnPublish: true, RetryBase: time.Minute, RetryMax: time.Hour}

	disable := failpoint.Enable(failpoint.AfterPublishBeforeMark, 1)
	n, err := newRelay(t, pool, pub, cfg).RelayOnce(ctx)
	disable()
	if n != 2 || err == nil {
		t.Fatalf("RelayOnce at the failpoint: %d, %v; want 2 rows and the crash error", n, err)
	}
	for _, e := range []events.Envelope{failing, fine} {
		if s := state(t, pool, e.EventID); s.Published || s.Attempts != 0 {
			t.Fatalf("after the crash, %s: %+v; want the row kept, nothing recorded", e.AggregateID, s)
		}
	}

	flaky := &flakyPublisher{next: pub, failIDs: map[uuid.UUID]int{failing.EventID: 1}}
	relay := newRelay(t, pool, flaky, cfg)
	if n, err := relay.RelayOnce(ctx); n != 2 || err != nil {
		t.Fatalf("RelayOnce: %d, %v; want 2 rows claimed", n, err)
	}
	if left := count(t, pool, `SELECT count(*) FROM outbox WHERE id = $1`, fine.EventID); left != 0 {
		t.Fatalf("the accepted row is still in the outbox; want it deleted")
	}
	s := state(t, pool, failing.EventID)
	if s.Published || s.Attempts != 1 || s.LastError == nil || s.DueIn < 30*time.Second {
		t.Fatalf("the failed row: %+v; want it kept, attempt 1 recorded with its error, due in about a minute", s)
	}
	if m := state(t, pool, marked.EventID); !m.Published {
		t.Fatalf("the row marked before the switch: %+v; want it left as it was", m)
	}
	if _, err := pool.Exec(ctx, `UPDATE outbox SET next_attempt_at = now() WHERE id = $1`, failing.EventID); err != nil {
		t.Fatal(err)
	}
	if n, err := relay.RelayOnce(ctx); n != 1 || err != nil {
		t.Fatalf("RelayOnce once due: %d, %v; want the failed row", n, err)
	}
	if left := count(t, pool, `SELECT count(*) FROM outbox WHERE published_at IS NULL`); left != 0 {
		t.Fatalf("%d unpublished rows left; want none", left)
	}

	got := map[string]int{}
	for _, m := range receive(t, c, q, 5, 10*time.Second, true) {
		got[m.Attributes["event_id"]]++
	}
	want := map[string]int{marked.EventID.String(): 1, failing.EventID.String(): 2, fine.EventID.String(): 2}
	if !maps.Equal(got, want) {
		t.Fatalf("sends per event %v; want %v (the crashed batch twice, the failed send once)", got, want)
	}
}

// A failed send is rescheduled in the database (attempts, last_error,
// next_attempt_at = now + RetryBase*2^(attempts-1), jittered ±25%), not
// retried in a sleep; the rest of its batch is published; it is published
// once it is due again.
func TestFailedSendsAreRetriedWithBackoff(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := setup(t)
	c, q, pub := queue(t)
	once, twice, fine := newEvent(t, 1), newEvent(t, 2), newEvent(t, 3)
	addCommitted(t, ctx, pool, once, twice, fine)
	flaky := &flakyPublisher{next: pub, failIDs: map[uuid.UUID]int{once.EventID: 1, twice.EventID: 2}}
	const base = 400 * time.Millisecond
	relay := newRelay(t, pool, flaky, outbox.RelayConfig{RetryBase: base, RetryMax: time.Minute})

	if n, err := relay.RelayOnce(ctx); n != 3 || err != nil {
		t.Fatalf("RelayOnce: %d, %v; want 3", n, err)
	}
	// The failed rows are rescheduled within [0.75, 1.25] * base.
	for _, id := range []uuid.UUID{once.EventID, twice.EventID} {
		s := state(t, pool, id)
		if s.Published || s.Claimed || s.Attempts != 1 || s.LastError == nil || !strings.Contains(*s.LastError, errInjected.Error()) {
			t.Fatalf("failed row %s: %+v; want unpublished, unclaimed, attempts 1, last_error %q", id, s, errInjected)
		}
		if s.DueIn <= 0 || s.DueIn > base*5/4 || s.DueIn < base*3/4-100*time.Millisecond {
			t.Fatalf("failed row due in %v, want in the future within [0.75, 1.25] x %v", s.DueIn, base)
		}
	}
	if s := state(t, pool, fine.EventID); !s.Published || s.LastError != nil {
		t.Fatalf("the good row of the batch: %+v, want published", s)
	}
	// Not due yet: nothing to claim (backoff is in the database, not a sleep).
	if n, err := relay.RelayOnce(ctx); n != 0 || err != nil {
		t.Fatalf("RelayOnce before the rows are due: %d, %v; want 0", n, err)
	}

	time.Sleep(base*5/4 + 50*time.Millisecond)
	if n, err := relay.RelayOnce(ctx); n != 2 || err != nil {
		t.Fatalf("RelayOnce when due: %d, %v; want 2", n, err)
	}
	if s := state(t, pool, once.EventID); !s.Published || s.Attempts != 2 || s.LastError != nil {
		t.Fatalf("row failed once, after its retry: %+v; want published at attempt 2, last_error cleared", s)
	}
	s := state(t, pool, twice.EventID)
	if s.Published || s.Attempts != 2 || s.DueIn > 2*base*5/4 || s.DueIn < 2*base*3/4-100*time.Millisecond {
		t.Fatalf("row failed twice: %+v; want unpublished, attempts 2, due within [0.75, 1.25] x 2 x %v", s, base)
	}
	waitFor(t, 5*time.Second, "the twice-failed row to be published", func() bool {
		if _, err := relay.RelayOnce(ctx); err != nil {
			t.Fatal(err)
		}
		return state(t, pool, twice.EventID).Published
	})
	if s := state(t, pool, twice.EventID); s.Attempts != 3 {
		t.Fatalf("twice-failed row published at attempt %d, want 3", s.Attempts)
	}

	got := receive(t, c, q, 4, 3*time.Second, true)
	ids := map[string]int{}
	for _, m := range got {
		ids[m.Attributes["event_id"]]++
	}
	if len(got) != 3 || len(ids) != 3 {
		t.Fatalf("received %v, want each of the 3 events once (failed sends were never accepted)", ids)
	}
}

// A publisher error for the whole call reschedules every row of the batch.
func TestPublisherErrorReschedulesTheBatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := setup(t)
	_, _, pub := queue(t)
	a, b := newEvent(t, 1), newEvent(t, 2)
	addCommitted(t, ctx, pool, a, b)
	metrics := testenv.NewMetrics()
	relay := newRelay(t, pool, &flakyPublisher{next: pub, failCalls: 1}, outbox.RelayConfig{RetryBase: 200 * time.Millisecond,
		MeterProvider: metrics.Provider, MetricsCacheTTL: time.Nanosecond})
	if got := metrics.Value(t, "outbox_unpublished"); got != 2 {
		t.Errorf("outbox_unpublished = %v before the relay ran, want 2", got)
	}
	if n, err := relay.RelayOnce(ctx); n != 2 || err != nil {
		t.Fatalf("RelayOnce: %d, %v", n, err)
	}
	if got := metrics.Value(t, "outbox_publish_failures_total"); got != 2 {
		t.Errorf("outbox_publish_failures_total = %v after one failed batch of 2, want 2", got)
	}
	for _, id := range []uuid.UUID{a.EventID, b.EventID} {
		if s := state(t, pool, id); s.Published || s.Claimed || s.LastError == nil || s.DueIn <= 0 {
			t.Fatalf("row %s after a failed call: %+v; want rescheduled", id, s)
		}
	}
	waitFor(t, 5*time.Second, "both rows published", func() bool {
		if _, err := relay.RelayOnce(ctx); err != nil {
			t.Fatal(err)
		}
		return count(t, pool, `SELECT count(*) FROM outbox WHERE published_at IS NULL`) == 0
	})
	for name, want := range map[string]float64{"outbox_published_total": 2, "outbox_publish_failures_total": 2, "outbox_unpublished": 0} {
		if got := metrics.Value(t, name); got != want {
			t.Errorf("%s = %v once both rows are published, want %v", name, got, want)
		}
	}
}

// A publisher that names, among its failures, a row outside the batch (a
// bug of its own) cannot unpublish that row: only the batch's rows are
// rescheduled or marked.
func TestPublisherNamingAnotherRowLeavesItPublished(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := setup(t)
	_, _, pub := queue(t)
	sent, fresh := newEvent(t, 1), newEvent(t, 2)
	addCommitted(t, ctx, pool, sent)
	if n, err := newRelay(t, pool, pub, outbox.RelayConfig{}).RelayOnce(ctx); n != 1 || err != nil {
		t.Fatalf("first RelayOnce: %d, %v", n, err)
	}
	addCommitted(t, ctx, pool, fresh)
	relay := newRelay(t, pool, &namingPublisher{next: pub, also: sent.EventID}, outbox.RelayConfig{})
	if n, err := relay.RelayOnce(ctx); n != 1 || err != nil {
		t.Fatalf("second RelayOnce: %d, %v", n, err)
	}
	if s := state(t, pool, sent.EventID); !s.Published || s.Attempts != 1 || s.LastError != nil {
		t.Errorf("the row of the earlier batch: %+v; want still published, attempts 1, no error", s)
	}
	if s := state(t, pool, fresh.EventID); !s.Published || s.Attempts != 1 {
		t.Errorf("the batch's row: %+v; want published, attempts 1", s)
	}
}

// namingPublisher publishes through next and then also reports also as failed.
type namingPublisher struct {
	next outbox.Publisher
	also uuid.UUID
}

func (p *namingPublisher) PublishBatch(ctx context.Context, msgs []outbox.Message) (map[uuid.UUID]error, error) {
	failed, err := p.next.PublishBatch(ctx, msgs)
	if failed == nil {
		failed = map[uuid.UUID]error{}
	}
	failed[p.also] = errInjected
	return failed, err
}

// A row that has failed many times is still rescheduled at RetryMax: the
// exponential term must not overflow PostgreSQL's interval (it did from
// about 45 attempts, i.e. after ~3 hours of a persistent failure, and then
// every reschedule of the batch failed and rows were re-sent on every lease
// expiry instead).
func TestBackoffIsCappedAfterManyAttempts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := setup(t)
	_, _, pub := queue(t)
	e := newEvent(t, 1)
	addCommitted(t, ctx, pool, e)
	for _, attempts := range []int{44, 60, 1100, 1 << 30} {
		if _, err := pool.Exec(ctx, `UPDATE outbox SET attempts = $1, next_attempt_at = now(), claimed_until = NULL`, attempts); err != nil {
			t.Fatal(err)
		}
		relay := newRelay(t, pool, &flakyPublisher{next: pub, failIDs: map[uuid.UUID]int{e.EventID: 1}},
			outbox.RelayConfig{RetryBase: time.Second, RetryMax: 5 * time.Minute})
		if n, err := relay.RelayOnce(ctx); n != 1 || err != nil {
			t.Fatalf("attempt %d: RelayOnce %d, %v; want the failure rescheduled without error", attempts+1, n, err)
		}
		s := state(t, pool, e.EventID)
		if s.Claimed || s.DueIn < 5*time.Minute*3/4-time.Second || s.DueIn > 5*time.Minute*5/4 {
			t.Fatalf("attempt %d: %+v; want due in about RetryMax (5m ±25%%)", attempts+1, s)
		}
	}
}

// Cleanup deletes published rows older than KeepPublished, in chunks, and
// nothing else; Run does it every CleanupInterval.
func TestCleanupDeletesOnlyOldPublishedRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := setup(t)
	_, _, pub := queue(t)
	if _, err := pool.Exec(ctx, `
		INSERT INTO outbox (id, aggregate_id, aggregate_version, event_type, payload, occurred_at, created_at, published_at)
		SELECT gen_random_uuid(), 'old-published', 1, 'T', '{}', now(), now() - interval '3 days', now() - interval '2 days'
		FROM generate_series(1, 2500);
		INSERT INTO outbox (id, aggregate_id, aggregate_version, event_type, payload, occurred_at, created_at, published_at) VALUES
			(gen_random_uuid(), 'recent-published', 1, 'T', '{}', now(), now() - interval '3 days', now() - interval '1 hour'),
			(gen_random_uuid(), 'old-unpublished', 1, 'T', '{}', now(), now() - interval '3 days', NULL);`); err != nil {
		t.Fatal(err)
	}
	// Keep the unpublished row away from the relay that runs below.
	if _, err := pool.Exec(ctx, `UPDATE outbox SET next_attempt_at = now() + interval '1 hour' WHERE published_at IS NULL`); err != nil {
		t.Fatal(err)
	}
	relay := newRelay(t, pool, pub, outbox.RelayConfig{KeepPublished: 24 * time.Hour})
	n, err := relay.Cleanup(ctx)
	if err != nil || n != 2500 {
		t.Fatalf("Cleanup: %d, %v; want 2500 (in chunks of 1000)", n, err)
	}
	if n := count(t, pool, `SELECT count(*) FROM outbox WHERE aggregate_id IN ('recent-published', 'old-unpublished')`); n != 2 {
		t.Fatalf("%d of the rows to keep are left, want 2", n)
	}
	if n := count(t, pool, `SELECT count(*) FROM outbox`); n != 2 {
		t.Fatalf("%d rows left, want 2", n)
	}

	// The loop in Run: with KeepPublished 30m the recent row goes too.
	stop := runRelay(t, newRelay(t, pool, pub, outbox.RelayConfig{KeepPublished: 30 * time.Minute, CleanupInterval: 100 * time.Millisecond}))
	waitFor(t, 5*time.Second, "Run's cleanup", func() bool {
		return count(t, pool, `SELECT count(*) FROM outbox WHERE aggregate_id = 'recent-published'`) == 0
	})
	stop()
	if n := count(t, pool, `SELECT count(*) FROM outbox WHERE aggregate_id = 'old-unpublished'`); n != 1 {
		t.Fatalf("the unpublished row was deleted")
	}
}

// slowPublisher reports when a call starts and holds it for a while,
// ignoring cancellation as a network call in flight would.
type slowPublisher struct {
	next    outbox.Publisher
	started chan struct{}
	hold    time.Duration
}

func (p *slowPublisher) PublishBatch(ctx context.Context, msgs []outbox.Message) (map[uuid.UUID]error, error) {
	select {
	case p.started <- struct{}{}:
	default:
	}
	time.Sleep(p.hold)
	return p.next.PublishBatch(ctx, msgs)
}

// A batch on the wire when Run is cancelled is still marked, so a clean
// shutdown causes no duplicate send.
func TestShutdownMarksTheBatchOnTheWire(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := setup(t)
	c, q, pub := queue(t)
	slow := &slowPublisher{next: pub, started: make(chan struct{}, 1), hold: 500 * time.Millisecond}
	stop := runRelay(t, newRelay(t, pool, slow, outbox.RelayConfig{PollInterval: 50 * time.Millisecond}))
	e := newEvent(t, 1)
	addCommitted(t, ctx, pool, e)
	select {
	case <-slow.started:
	case <-time.After(10 * time.Second):
		t.Fatal("the relay never published")
	}
	stop() // while the batch is on the wire
	if s := state(t, pool, e.EventID); !s.Published || s.Attempts != 1 {
		t.Fatalf("after shutdown: %+v; want published and marked at attempt 1", s)
	}
	if got := receive(t, c, q, 2, 2*time.Second, true); len(got) != 1 {
		t.Fatalf("received %d copies, want 1", len(got))
	}
}

// The LISTEN session comes back after it is killed, promptly each time:
// the reconnect backoff starts over once a session was established, so a
// relay whose connection drops now and then does not drift to the 10 s
// maximum. Notifications work again afterwards.
func TestListenReconnectsPromptly(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := setup(t)
	c, q, pub := queue(t)
	runRelay(t, newRelay(t, pool, pub, outbox.RelayConfig{PollInterval: 10 * time.Second, Logger: slog.New(&errorLog{})}))
	waitFor(t, 10*time.Second, "the relay's LISTEN session", func() bool { return listeners(t, pool) == 1 })
	listenerPID := func() (pid int32) {
		err := pool.QueryRow(ctx, `SELECT coalesce(max(pid), 0) FROM pg_stat_activity
			WHERE datname = current_database() AND query = 'LISTEN outbox'`).Scan(&pid)
		if err != nil {
			t.Fatal(err)
		}
		return pid
	}
	for i := range 6 {
		old := listenerPID()
		var ok bool
		if err := pool.QueryRow(ctx, `SELECT pg_terminate_backend($1)`, old).Scan(&ok); err != nil || !ok {
			t.Fatalf("terminate the LISTEN session: %v, %v", ok, err)
		}
		killed := time.Now()
		waitFor(t, 15*time.Second, "LISTEN to be re-established", func() bool { p := listenerPID(); return p != 0 && p != old })
		if d := time.Since(killed); d > time.Second {
			t.Fatalf("reconnect %d took %v, want well under a second", i+1, d)
		}
	}
	time.Sleep(100 * time.Millisecond)
	e := newEvent(t, 1)
	addCommitted(t, ctx, pool, e)
	committed := time.Now()
	got := receive(t, c, q, 1, 8*time.Second, true)
	if len(got) != 1 || got[0].At.Sub(committed) > 5*time.Second {
		t.Fatalf("after reconnecting, the event was not published promptly: %v", got)
	}
}

// hangingPublisher accepts every message but one, and hangs on that one
// until its context ends, as one SendMessageBatch call of several can.
type hangingPublisher struct {
	hang     uuid.UUID
	mu       sync.Mutex
	accepted []uuid.UUID
}

func (p *hangingPublisher) PublishBatch(ctx context.Context, msgs []outbox.Message) (map[uuid.UUID]error, error) {
	failed := map[uuid.UUID]error{}
	for _, m := range msgs {
		if m.EventID == p.hang {
			<-ctx.Done()
			failed[m.EventID] = ctx.Err()
			continue
		}
		p.mu.Lock()
		p.accepted = append(p.accepted, m.EventID)
		p.mu.Unlock()
	}
	return failed, nil
}

// A publish that runs until its deadline does not take the mark down with
// it: the publish gets less than the lease, the rows the publisher accepted
// are marked published on a context of their own, and the row that hung is
// rescheduled by backoff, not left to be claimed and sent again on every
// lease.
func TestSlowPublishStillMarksTheAcceptedRowsAndBacksOffTheRest(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := setup(t)
	a, b, slow := newEvent(t, 1), newEvent(t, 2), newEvent(t, 3)
	addCommitted(t, ctx, pool, a, b, slow)
	pub := &hangingPublisher{hang: slow.EventID}
	relay := newRelay(t, pool, pub, outbox.RelayConfig{Lease: time.Second, RetryBase: 10 * time.Second})
	if n, err := relay.RelayOnce(ctx); n != 3 || err != nil {
		t.Fatalf("RelayOnce: %d, %v; want 3 claimed and no error", n, err)
	}
	if len(pub.accepted) != 2 {
		t.Fatalf("publisher accepted %d, want 2", len(pub.accepted))
	}
	for _, id := range []uuid.UUID{a.EventID, b.EventID} {
		if s := state(t, pool, id); !s.Published {
			t.Errorf("accepted row %s: %+v, want published", id, s)
		}
	}
	s := state(t, pool, slow.EventID)
	if s.Published || s.Claimed || s.LastError == nil || s.DueIn <= time.Second {
		t.Fatalf("the row that hung: %+v; want unpublished, unclaimed, with its error, due after its backoff", s)
	}
	// Nothing is due: the next claim sends nothing again.
	if n, err := relay.RelayOnce(ctx); n != 0 || err != nil {
		t.Fatalf("second RelayOnce: %d, %v; want nothing claimed", n, err)
	}
	if _, err := outbox.NewRelay(pool, pub, outbox.RelayConfig{Lease: time.Second, PublishTimeout: time.Second}); err == nil {
		t.Fatal("NewRelay accepted a PublishTimeout as long as the lease")
	}
}

// A failed row's backoff runs from when the publish ended, not from when
// its claim began: after a publish that took longer than RetryBase, a
// backoff counted from the claim would already be over, and the row sent
// again by the very next claim.
func TestAFailedRowsBackoffStartsAfterASlowPublish(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := setup(t)
	slow := newEvent(t, 1)
	addCommitted(t, ctx, pool, slow)
	pub := &hangingPublisher{hang: slow.EventID}
	relay := newRelay(t, pool, pub, outbox.RelayConfig{Lease: 4 * time.Second, PublishTimeout: 1500 * time.Millisecond, RetryBase: time.Second})
	if n, err := relay.RelayOnce(ctx); n != 1 {
		t.Fatalf("RelayOnce: %d, %v; want the row claimed", n, err)
	}
	if s := state(t, pool, slow.EventID); s.Published || s.DueIn < 500*time.Millisecond {
		t.Fatalf("the row whose publish timed out after 1.5 s: %+v; want due about RetryBase (1 s) from now", s)
	}
	if n, _ := relay.RelayOnce(ctx); n != 0 {
		t.Fatalf("the next claim took %d rows; want none before the backoff", n)
	}
}

// The failed rows of a batch are rescheduled even when marking its
// published rows fails: otherwise they would come back at the end of the
// lease with no backoff, again and again.
func TestFailedRowsAreRescheduledEvenWhenMarkingPublishedOnesFails(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := setup(t)
	good, bad := newEvent(t, 1), newEvent(t, 2)
	addCommitted(t, ctx, pool, good, bad)
	if _, err := pool.Exec(ctx, `
		CREATE FUNCTION refuse_mark() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN RAISE EXCEPTION 'mark refused'; END $$;
		CREATE TRIGGER refuse_mark BEFORE UPDATE OF published_at ON outbox FOR EACH ROW
			WHEN (NEW.published_at IS NOT NULL) EXECUTE FUNCTION refuse_mark();`); err != nil {
		t.Fatal(err)
	}
	_, _, sqsPub := queue(t)
	pub := &flakyPublisher{next: sqsPub, failIDs: map[uuid.UUID]int{bad.EventID: 1}}
	relay := newRelay(t, pool, pub, outbox.RelayConfig{RetryBase: 10 * time.Second})
	if _, err := relay.RelayOnce(ctx); err == nil || !strings.Contains(err.Error(), "mark published") {
		t.Fatalf("RelayOnce: %v; want the mark's error", err)
	}
	if s := state(t, pool, bad.EventID); s.Published || s.Claimed || s.LastError == nil || s.DueIn <= time.Second {
		t.Fatalf("the failed row: %+v; want rescheduled by backoff", s)
	}
}

// hasMetric reports whether the last collection of m holds a metric named name.
func hasMetric(t testing.TB, m *testenv.Metrics, name string) bool {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := m.Reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	for _, sm := range rm.ScopeMetrics {
		for _, mt := range sm.Metrics {
			if mt.Name == name {
				return true
			}
		}
	}
	return false
}

// The backlog gauges do not query on every scrape: their values are cached
// for MetricsCacheTTL, the count stops at a bound (a backlog of millions
// costs what one of the bound does), and they are unregistered when Run
// returns, so a stopped relay leaves no gauge reading a stale table.
func TestRelayGaugesAreCachedBoundedAndUnregisteredOnStop(t *testing.T) {
	t.Parallel()
	defer outbox.SetGaugeCap(5)()
	ctx := context.Background()
	pool := setup(t)
	addCommitted(t, ctx, pool, newEvent(t, 1), newEvent(t, 2), newEvent(t, 3))
	m := testenv.NewMetrics()
	const ttl = 300 * time.Millisecond
	relay := newRelay(t, pool, &flakyPublisher{failCalls: 1 << 30}, outbox.RelayConfig{MeterProvider: m.Provider,
		MetricsCacheTTL: ttl, RetryBase: time.Hour})
	if got := m.Value(t, "outbox_unpublished"); got != 3 {
		t.Fatalf("outbox_unpublished = %v, want 3", got)
	}
	addCommitted(t, ctx, pool, newEvent(t, 4))
	if got := m.Value(t, "outbox_unpublished"); got != 3 {
		t.Fatalf("outbox_unpublished = %v right after the last scrape, want the cached 3", got)
	}
	time.Sleep(ttl + 50*time.Millisecond)
	if got := m.Value(t, "outbox_unpublished"); got != 4 {
		t.Fatalf("outbox_unpublished = %v once the cache expired, want 4", got)
	}
	addCommitted(t, ctx, pool, newEvent(t, 5), newEvent(t, 6), newEvent(t, 7))
	time.Sleep(ttl + 50*time.Millisecond)
	if got := m.Value(t, "outbox_unpublished"); got != 5 {
		t.Fatalf("outbox_unpublished = %v with 7 rows, want the bound 5", got)
	}
	if got := m.Value(t, "outbox_oldest_unpublished_age_seconds"); got <= 0 {
		t.Fatalf("outbox_oldest_unpublished_age_seconds = %v, want > 0", got)
	}
	stop := runRelay(t, relay)
	waitFor(t, 5*time.Second, "the relay to try the rows", func() bool {
		return count(t, pool, `SELECT count(*) FROM outbox WHERE attempts > 0`) == 7
	})
	stop()
	for _, name := range []string{"outbox_unpublished", "outbox_oldest_unpublished_age_seconds"} {
		if hasMetric(t, m, name) {
			t.Errorf("%s still reported after Run returned", name)
		}
	}
}

// stuckPublisher accepts nothing and ignores its context until released,
// as a relay frozen mid-publish (a stopped process, a cut-off network)
// would.
type stuckPublisher struct {
	started, release chan struct{}
}

func (p *stuckPublisher) PublishBatch(context.Context, []outbox.Message) (map[uuid.UUID]error, error) {
	close(p.started)
	<-p.release
	return nil, nil
}

// A relay stuck mid-batch holds its rows no longer than its Lease: the
// server ends its idle transaction, another relay publishes the rows, and
// the stuck relay's late mark fails instead of marking rows it no longer
// holds.
func TestStuckRelayReleasesItsRowsAfterTheLease(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := setup(t)
	_, _, pub := queue(t)
	e := newEvent(t, 1)
	addCommitted(t, ctx, pool, e)
	stuck := &stuckPublisher{started: make(chan struct{}), release: make(chan struct{})}
	const lease = time.Second
	frozen := newRelay(t, pool, stuck, outbox.RelayConfig{Lease: lease})
	done := make(chan error, 1)
	go func() { _, err := frozen.RelayOnce(ctx); done <- err }()
	<-stuck.started
	rescuer := newRelay(t, pool, pub, outbox.RelayConfig{Lease: lease})
	if n, err := rescuer.RelayOnce(ctx); n != 0 || err != nil {
		t.Fatalf("a second relay while the first holds the row: %d, %v; want nothing claimed", n, err)
	}
	start := time.Now()
	waitFor(t, 10*time.Second, "the server to end the stuck relay's transaction and the row to be published", func() bool {
		n, err := rescuer.RelayOnce(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return n == 1
	})
	if el := time.Since(start); el > 5*lease {
		t.Errorf("the row came back after %v, want about the lease (%v)", el, lease)
	}
	close(stuck.release)
	if err := <-done; err == nil {
		t.Fatal("the stuck relay's mark succeeded after its session was ended")
	}
	if s := state(t, pool, e.EventID); !s.Published || s.Attempts != 1 {
		t.Fatalf("after the rescue: %+v; want published once, attempts 1", s)
	}
}

// A mark that runs out of MarkTimeout (here a trigger holds it for 2 s)
// still leaves the batch's failed rows rescheduled, on a context of their
// own: backed off with the attempt and its error recorded, not due again
// at once to be re-sent every poll.
func TestFailedRowsAreRescheduledWhenTheMarkTimesOut(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := setup(t)
	_, _, pub := queue(t)
	if _, err := pool.Exec(ctx, `CREATE FUNCTION slow_mark() RETURNS trigger LANGUAGE plpgsql AS
			$$ BEGIN PERFORM pg_sleep(2); RETURN NEW; END $$;
		CREATE TRIGGER slow_mark BEFORE UPDATE ON outbox FOR EACH ROW
			WHEN (NEW.published_at IS NOT NULL AND OLD.published_at IS NULL) EXECUTE FUNCTION slow_mark()`); err != nil {
		t.Fatal(err)
	}
	failing, fine := newEvent(t, 1), newEvent(t, 2)
	addCommitted(t, ctx, pool, failing, fine)
	flaky := &flakyPublisher{next: pub, failIDs: map[uuid.UUID]int{failing.EventID: 1}}
	relay := newRelay(t, pool, flaky, outbox.RelayConfig{MarkTimeout: 300 * time.Millisecond, RetryBase: time.Minute, RetryMax: time.Hour})
	if _, err := relay.RelayOnce(ctx); err == nil || !strings.Contains(err.Error(), "mark published") {
		t.Fatalf("RelayOnce with a mark held past its timeout: %v; want the mark's error", err)
	}
	if s := state(t, pool, failing.EventID); s.Attempts != 1 || s.LastError == nil || s.DueIn < 30*time.Second {
		t.Errorf("the failed row after the mark timed out: %+v; want attempt 1 recorded with its error, due in about a minute", s)
	}
}

// A publisher's error that PostgreSQL cannot store as text (a NUL, bytes
// that are not UTF-8) or that is very long is stored cleaned: valid UTF-8,
// no NUL, at most 2 KB. Before, the whole finish of the batch failed on it:
// the rows the queue accepted were never marked and were sent again on
// every pass, and the failed row's fallback reschedule failed the same way,
// so it was due again at once, for ever.
func TestAFailureReasonPostgresCannotStoreIsStoredCleanedAndTheBatchIsMarked(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := setup(t)
	good, odd, long := newEvent(t, 1), newEvent(t, 2), newEvent(t, 3)
	addCommitted(t, ctx, pool, good, odd, long)
	pub := &refusingPublisher{refuse: map[uuid.UUID]error{
		odd.EventID:  errors.New("sqs rejected the message: odd: \x00\xff end"),
		long.EventID: errors.New("sqs rejected the message: " + strings.Repeat("é", 5000)),
	}}
	relay := newRelay(t, pool, pub, outbox.RelayConfig{DisableListen: true, RetryBase: time.Minute, RetryMax: time.Hour})
	for i := range 3 {
		if n, err := relay.RelayOnce(ctx); err != nil || n != []int{3, 0, 0}[i] {
			t.Errorf("RelayOnce %d: claimed %d, %v; want 3 and then nothing (the refused rows backed off)", i+1, n, err)
		}
	}
	if s, sends := state(t, pool, good.EventID), pub.sends(good.EventID); !s.Published || sends != 1 {
		t.Errorf("the accepted row after 3 passes: %+v, sent %d times; want published after its one send", s, sends)
	}
	s := state(t, pool, odd.EventID)
	if s.LastError == nil || s.Attempts != 1 || s.DueIn < 30*time.Second {
		t.Fatalf("the row refused with a NUL and a non-UTF-8 byte in its error: %+v; want rescheduled by backoff (about a minute)", s)
	}
	if got, want := *s.LastError, "sqs rejected the message: odd: \uFFFD end"; got != want {
		t.Errorf("its last_error is %q, want %q", got, want)
	}
	s = state(t, pool, long.EventID)
	if s.LastError == nil || s.DueIn < 30*time.Second {
		t.Fatalf("the row refused with a 10 KB error: %+v; want rescheduled by backoff", s)
	}
	if n := len(*s.LastError); n > 2048 || !utf8.ValidString(*s.LastError) || !strings.HasPrefix(*s.LastError, "sqs rejected the message: éé") {
		t.Errorf("its last_error holds %d bytes (valid UTF-8: %v): %.60q...; want the start of the error, at most 2048 bytes",
			n, utf8.ValidString(*s.LastError), *s.LastError)
	}
}

// refusingPublisher accepts every message but those in refuse, which it
// reports failed with their error, and counts each id's sends.
type refusingPublisher struct {
	refuse   map[uuid.UUID]error
	mu       sync.Mutex
	accepted map[uuid.UUID]int
}

func (p *refusingPublisher) PublishBatch(_ context.Context, msgs []outbox.Message) (map[uuid.UUID]error, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.accepted == nil {
		p.accepted = map[uuid.UUID]int{}
	}
	failed := map[uuid.UUID]error{}
	for _, m := range msgs {
		if err, ok := p.refuse[m.EventID]; ok {
			failed[m.EventID] = err
			continue
		}
		p.accepted[m.EventID]++
	}
	return failed, nil
}

func (p *refusingPublisher) sends(id uuid.UUID) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.accepted[id]
}
