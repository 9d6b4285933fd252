package idempotent_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/effectively-once/payments-cashback/pkg/events"
	"github.com/effectively-once/payments-cashback/pkg/idempotent"
)

func TestInboxReceiveStoresOnceAndRefusesConflicts(t *testing.T) {
	t.Parallel()
	pool := inboxSetup(t)
	m := newMetrics()
	in := newInbox(t, pool, "notifications", idempotent.InboxConfig{MeterProvider: m.Provider})
	ctx := context.Background()
	e := keyedEvent(t, "cb_1", 1)

	stored, err := in.Receive(ctx, e, "cb_1")
	if err != nil || !stored {
		t.Fatalf("first copy: stored=%v err=%v, want stored", stored, err)
	}
	for range 2 {
		stored, err = in.Receive(ctx, e, "cb_1")
		if err != nil || stored {
			t.Fatalf("second copy: stored=%v err=%v, want a duplicate (nil, not stored)", stored, err)
		}
	}
	forged := e
	forged.Payload = []byte(`{"key":"cb_1","version":1,"amount_paise":999999}`)
	if _, err := in.Receive(ctx, forged, "cb_1"); !errors.Is(err, idempotent.ErrConflict) || !idempotent.IsPermanent(err) {
		t.Fatalf("same id, other payload: %v, want permanent ErrConflict", err)
	}
	if _, err := in.Receive(ctx, keyedEvent(t, "cb_2", 1), ""); err == nil || !idempotent.IsPermanent(err) {
		t.Fatalf("empty ordering key: %v, want a permanent error", err)
	}
	bad := keyedEvent(t, "cb_3", 1)
	bad.EventType = ""
	if _, err := in.Receive(ctx, bad, "cb_3"); err == nil || !idempotent.IsPermanent(err) {
		t.Fatalf("invalid envelope: %v, want a permanent error", err)
	}
	if n := count(t, pool, `SELECT count(*) FROM inbox`); n != 1 {
		t.Fatalf("inbox rows = %d, want 1", n)
	}
	r := inboxRow(t, pool, "notifications", e.EventID)
	if r.Status != "PENDING" || r.Attempts != 0 {
		t.Fatalf("stored row %+v, want PENDING with 0 attempts", r)
	}
	// The same event in another consumer's inbox is its own row.
	other := newInbox(t, pool, "analytics", idempotent.InboxConfig{MeterProvider: m.Provider})
	if stored, err := other.Receive(ctx, e, "cb_1"); !stored || err != nil {
		t.Fatalf("other consumer: stored=%v err=%v", stored, err)
	}
	for outcome, want := range map[string]float64{"stored": 1, "duplicate": 2, "conflict": 1, "invalid": 2} {
		if got := m.Value(t, "inbox_received_total", "consumer", "notifications", "outcome", outcome); got != want {
			t.Errorf("inbox_received_total{outcome=%s} = %v, want %v", outcome, got, want)
		}
	}
	if got := m.Value(t, "inbox_refused_total", "consumer", "notifications", "reason", "conflict"); got != 1 {
		t.Errorf("inbox_refused_total{reason=conflict} = %v, want 1", got)
	}
}

// v7At is a UUIDv7 whose timestamp is t.
func v7At(t time.Time) uuid.UUID {
	u := uuid.Must(uuid.NewV7())
	var ms [8]byte
	binary.BigEndian.PutUint64(ms[:], uint64(t.UnixMilli()))
	copy(u[:6], ms[2:])
	return u
}

func TestInboxRefusesMessagesOlderThanTheWindow(t *testing.T) {
	t.Parallel()
	pool := inboxSetup(t)
	m := newMetrics()
	in := newInbox(t, pool, "notifications", idempotent.InboxConfig{MeterProvider: m.Provider}) // 15-day window
	ctx := context.Background()

	old := keyedEvent(t, "cb_1", 1)
	old.OccurredAt = time.Now().Add(-16 * 24 * time.Hour).UTC()
	oldID := keyedEvent(t, "cb_2", 1)
	oldID.EventID = v7At(time.Now().Add(-16 * 24 * time.Hour)) // fresh occurred_at, ancient id
	for _, e := range []events.Envelope{old, oldID} {
		stored, err := in.Receive(ctx, e, e.AggregateID)
		if stored || !errors.Is(err, idempotent.ErrExpired) || !idempotent.IsPermanent(err) {
			t.Fatalf("old copy %s: stored=%v err=%v, want refused with permanent ErrExpired", e.EventID, stored, err)
		}
	}
	if n := count(t, pool, `SELECT count(*) FROM inbox`); n != 0 {
		t.Fatalf("inbox rows = %d, want 0: a refused copy is not stored", n)
	}
	if got := m.Value(t, "inbox_refused_total", "consumer", "notifications", "reason", "expired"); got != 2 {
		t.Fatalf("inbox_refused_total{reason=expired} = %v, want 2", got)
	}
	if stored, err := in.Receive(ctx, keyedEvent(t, "cb_3", 1), "cb_3"); !stored || err != nil {
		t.Fatalf("fresh copy: stored=%v err=%v", stored, err)
	}
}

func TestInboxConfigValidatesRetention(t *testing.T) {
	t.Parallel()
	pool := inboxSetup(t)
	if _, err := idempotent.NewInbox(pool, "x", idempotent.InboxConfig{Retention: 14 * 24 * time.Hour}); err == nil {
		t.Fatal("a 14-day window on 14-day queues was accepted")
	}
	if _, err := idempotent.NewMaintainer(pool, idempotent.MaintainerConfig{Retention: 10 * 24 * time.Hour}); err == nil {
		t.Fatal("maintainer accepted a 10-day window on 14-day queues")
	}
	if _, err := idempotent.NewInbox(pool, "", idempotent.InboxConfig{}); err == nil {
		t.Fatal("empty consumer accepted")
	}
}

// The acceptance test for order: 1,000 events over 10 keys, stored in a
// shuffled order, applied by 4 processors: every key's versions come out
// 1..100 in order, and keys ran in parallel.
func TestInboxAppliesShuffledArrivalsInPerKeyOrder(t *testing.T) {
	t.Parallel()
	pool := inboxSetup(t)
	in := newInbox(t, pool, "notifications", idempotent.InboxConfig{})
	const keys, perKey = 10, 100
	var evs []events.Envelope
	for k := range keys {
		for v := range perKey {
			evs = append(evs, keyedEvent(t, fmt.Sprintf("cb_%02d", k), int64(v+1)))
		}
	}
	rand.Shuffle(len(evs), func(i, j int) { evs[i], evs[j] = evs[j], evs[i] })
	for _, e := range evs {
		receive(t, in, e)
	}

	var running, peak atomic.Int64
	h := func(ctx context.Context, tx pgx.Tx, e events.Envelope) error {
		n := running.Add(1)
		defer running.Add(-1)
		for {
			p := peak.Load()
			if n <= p || peak.CompareAndSwap(p, n) {
				break
			}
		}
		time.Sleep(200 * time.Microsecond) // long enough for handlers to overlap
		return record(ctx, tx, e)
	}
	runProcessors(t, pool, in, h, idempotent.ProcessorConfig{BatchSize: 3, PollInterval: 20 * time.Millisecond}, 4)
	waitFor(t, 60*time.Second, "all rows DONE", func() bool {
		return count(t, pool, `SELECT count(*) FROM inbox WHERE status = 'DONE'`) == keys*perKey
	})

	got := appliedVersions(t, pool)
	if len(got) != keys {
		t.Fatalf("%d keys applied, want %d", len(got), keys)
	}
	for k, vs := range got {
		if len(vs) != perKey || !slices.IsSorted(vs) || vs[0] != 1 || vs[perKey-1] != perKey {
			t.Fatalf("key %s applied versions %v, want 1..%d in order", k, vs, perKey)
		}
	}
	if p := peak.Load(); p < 2 {
		t.Fatalf("at most %d handler ran at a time; different keys should run in parallel", p)
	}
	if n := count(t, pool, `SELECT count(*) FROM inbox WHERE attempts <> 1`); n != 0 {
		t.Fatalf("%d rows took more than one attempt", n)
	}
	t.Logf("peak parallel handlers: %d", peak.Load())
}

func TestInboxRetriesWithBackoffUntilDone(t *testing.T) {
	t.Parallel()
	pool := inboxSetup(t)
	in := newInbox(t, pool, "notifications", idempotent.InboxConfig{})
	e := keyedEvent(t, "cb_1", 1)
	receive(t, in, e)

	var calls []time.Time
	h := func(ctx context.Context, tx pgx.Tx, e events.Envelope) error {
		calls = append(calls, time.Now())
		if err := record(ctx, tx, e); err != nil { // written, then undone by the error
			return err
		}
		if len(calls) <= 3 {
			return errFlaky
		}
		return nil
	}
	const base = 200 * time.Millisecond
	runProcessors(t, pool, in, h, idempotent.ProcessorConfig{RetryBase: base, PollInterval: 10 * time.Millisecond}, 1)
	waitFor(t, 10*time.Second, "row DONE", func() bool { return inboxRow(t, pool, "notifications", e.EventID).Status == "DONE" })

	r := inboxRow(t, pool, "notifications", e.EventID)
	if r.Attempts != 4 || len(calls) != 4 {
		t.Fatalf("attempts = %d, handler calls = %d; want 4 and 4", r.Attempts, len(calls))
	}
	if r.LastError == nil || !strings.Contains(*r.LastError, errFlaky.Error()) {
		t.Fatalf("last_error = %v, want the last failure kept for the record", r.LastError)
	}
	if n := count(t, pool, `SELECT count(*) FROM applied`); n != 1 {
		t.Fatalf("applied rows = %d, want 1 (the failed attempts' writes rolled back)", n)
	}
	// After failure n the row waits a draw from [3d/4, 5d/4], d =
	// base*2^(n-1) (pkg/retry's ±25%), plus up to a poll interval and the
	// scheduling slack of a loaded machine, which only ever adds.
	for n := 1; n <= 3; n++ {
		gap := calls[n].Sub(calls[n-1])
		d := base << (n - 1)
		lo, hi := d*3/4, d*5/4
		t.Logf("attempt %d -> %d: %v (backoff range [%v, %v])", n, n+1, gap.Round(time.Millisecond), lo, hi)
		if gap < lo-5*time.Millisecond || gap > hi+time.Second {
			t.Errorf("gap after attempt %d = %v, want within [%v, %v] plus slack", n, gap, lo, hi)
		}
	}
	if calls[3].Sub(calls[2]) <= calls[1].Sub(calls[0]) {
		t.Errorf("backoff did not grow: %v then %v", calls[1].Sub(calls[0]), calls[3].Sub(calls[2]))
	}
}

func TestInboxPoisonRowFailsBlocksItsKeyAndReplayUnblocks(t *testing.T) {
	t.Parallel()
	pool := inboxSetup(t)
	m := newMetrics()
	in := newInbox(t, pool, "notifications", idempotent.InboxConfig{MeterProvider: m.Provider})
	ctx := context.Background()
	poison := keyedEvent(t, "cb_poison", 1)
	behind := []events.Envelope{keyedEvent(t, "cb_poison", 2), keyedEvent(t, "cb_poison", 3)}
	flaky := keyedEvent(t, "cb_flaky", 1)
	other := keyedEvent(t, "cb_ok", 1)
	for _, e := range append([]events.Envelope{poison, flaky, other}, behind...) {
		receive(t, in, e)
	}

	var fixed atomic.Bool
	var calls callCounter
	h := func(ctx context.Context, tx pgx.Tx, e events.Envelope) error {
		calls.inc(e.EventID)
		switch {
		case e.EventID == poison.EventID && !fixed.Load():
			return idempotent.Permanent(errors.New("template sms_v2 missing"))
		case e.EventID == flaky.EventID && !fixed.Load():
			return errFlaky
		}
		return record(ctx, tx, e)
	}
	stop := runProcessors(t, pool, in, h, idempotent.ProcessorConfig{MaxAttempts: 3, RetryBase: 20 * time.Millisecond,
		PollInterval: 10 * time.Millisecond}, 2)
	waitFor(t, 10*time.Second, "poison and flaky rows FAILED", func() bool {
		return count(t, pool, `SELECT count(*) FROM inbox WHERE status = 'FAILED'`) == 2
	})
	waitFor(t, 5*time.Second, "the other key DONE", func() bool {
		return inboxRow(t, pool, "notifications", other.EventID).Status == "DONE"
	})
	time.Sleep(200 * time.Millisecond) // give the blocked rows a chance to (wrongly) run
	stop()

	p := inboxRow(t, pool, "notifications", poison.EventID)
	if p.Attempts != 1 || p.LastError == nil || !strings.Contains(*p.LastError, "template sms_v2 missing") {
		t.Fatalf("poison row %+v: want FAILED after 1 attempt (permanent error) with its error text", p)
	}
	f := inboxRow(t, pool, "notifications", flaky.EventID)
	if f.Attempts != 3 || f.LastError == nil || !strings.Contains(*f.LastError, errFlaky.Error()) {
		t.Fatalf("flaky row %+v: want FAILED after MaxAttempts=3 with its error text", f)
	}
	for _, e := range behind {
		if r := inboxRow(t, pool, "notifications", e.EventID); r.Status != "PENDING" || r.Attempts != 0 || calls.get(e.EventID) != 0 {
			t.Fatalf("row v%d behind the poison: %+v, %d calls; want PENDING and never tried (blocked)", e.AggregateVersion, r, calls.get(e.EventID))
		}
	}
	failed, err := idempotent.ListFailed(ctx, pool, idempotent.FailedFilter{Consumer: "notifications"})
	if err != nil || len(failed) != 2 {
		t.Fatalf("ListFailed: %v, %d rows; want 2", err, len(failed))
	}
	for _, fr := range failed {
		if fr.EventID == poison.EventID && fr.Blocked != 2 {
			t.Fatalf("poison row blocks %d rows, want 2", fr.Blocked)
		}
	}
	if got := m.Value(t, "inbox_failed", "consumer", "notifications"); got != 2 {
		t.Fatalf("inbox_failed gauge = %v, want 2", got)
	}
	if got := m.Value(t, "inbox_pending", "consumer", "notifications"); got != 2 {
		t.Fatalf("inbox_pending gauge = %v, want 2", got)
	}

	// A filter that names nothing is refused; replaying a DONE row is a no-op.
	if _, err := idempotent.Replay(ctx, pool, idempotent.ReplayFilter{Consumer: "notifications"}); !errors.Is(err, idempotent.ErrReplayFilter) {
		t.Fatalf("replay without a filter: %v, want ErrReplayFilter", err)
	}
	if got, _ := idempotent.Replay(ctx, pool, idempotent.ReplayFilter{EventID: other.EventID}); len(got) != 0 {
		t.Fatalf("replaying a DONE row moved %d rows", len(got))
	}

	fixed.Store(true) // the fix is deployed
	got, err := idempotent.Replay(ctx, pool, idempotent.ReplayFilter{EventID: poison.EventID})
	if err != nil || len(got) != 1 {
		t.Fatalf("replay by id: %v, %v", got, err)
	}
	got, err = idempotent.Replay(ctx, pool, idempotent.ReplayFilter{Consumer: "notifications", EventType: "CashbackCredited"})
	if err != nil || len(got) != 1 || got[0].EventID != flaky.EventID {
		t.Fatalf("replay by filter: %v, %v; want the flaky row", got, err)
	}
	runProcessors(t, pool, in, h, idempotent.ProcessorConfig{PollInterval: 10 * time.Millisecond}, 2)
	waitFor(t, 10*time.Second, "everything DONE", func() bool {
		return count(t, pool, `SELECT count(*) FROM inbox WHERE status = 'DONE'`) == 5
	})
	if vs := appliedVersions(t, pool)["cb_poison"]; !slices.Equal(vs, []int64{1, 2, 3}) {
		t.Fatalf("poison key applied %v, want [1 2 3]", vs)
	}
	if r := inboxRow(t, pool, "notifications", poison.EventID); r.Attempts != 1 {
		t.Fatalf("replayed row attempts = %d, want 1 (a fresh budget)", r.Attempts)
	}
}

// A v1 that arrives after v2 is DONE cannot be put before it: the inbox
// still applies it (late), and the handler's own version check decides.
func TestInboxLateLowerVersionIsStillDelivered(t *testing.T) {
	t.Parallel()
	pool := inboxSetup(t)
	in := newInbox(t, pool, "notifications", idempotent.InboxConfig{})
	v1, v2 := keyedEvent(t, "cb_1", 1), keyedEvent(t, "cb_1", 2)
	receive(t, in, v2)
	runProcessors(t, pool, in, record, idempotent.ProcessorConfig{PollInterval: 10 * time.Millisecond}, 1)
	waitFor(t, 5*time.Second, "v2 DONE", func() bool { return inboxRow(t, pool, "notifications", v2.EventID).Status == "DONE" })
	receive(t, in, v1)
	waitFor(t, 5*time.Second, "v1 DONE", func() bool { return inboxRow(t, pool, "notifications", v1.EventID).Status == "DONE" })
	if vs := appliedVersions(t, pool)["cb_1"]; !slices.Equal(vs, []int64{2, 1}) {
		t.Fatalf("applied %v, want [2 1]: the late v1 reaches the handler", vs)
	}
}

// With a ReorderWindow, a v1 that arrives shortly after v2 still goes first.
func TestInboxReorderWindowOrdersCloseArrivals(t *testing.T) {
	t.Parallel()
	pool := inboxSetup(t)
	in := newInbox(t, pool, "notifications", idempotent.InboxConfig{})
	v1, v2 := keyedEvent(t, "cb_1", 1), keyedEvent(t, "cb_1", 2)
	// A window wide enough that a test held back on a loaded machine still
	// stores v1 inside it.
	runProcessors(t, pool, in, record, idempotent.ProcessorConfig{ReorderWindow: 5 * time.Second, PollInterval: 10 * time.Millisecond}, 2)
	receive(t, in, v2)
	time.Sleep(300 * time.Millisecond)
	if r := inboxRow(t, pool, "notifications", v2.EventID); r.Status != "PENDING" {
		t.Fatalf("v2 is %s before the window passed", r.Status)
	}
	receive(t, in, v1)
	waitFor(t, 15*time.Second, "both DONE", func() bool {
		return count(t, pool, `SELECT count(*) FROM inbox WHERE status = 'DONE'`) == 2
	})
	if vs := appliedVersions(t, pool)["cb_1"]; !slices.Equal(vs, []int64{1, 2}) {
		t.Fatalf("applied %v, want [1 2]", vs)
	}
}

func TestInboxBacklogFigures(t *testing.T) {
	t.Parallel()
	pool := inboxSetup(t)
	m := newMetrics()
	in := newInbox(t, pool, "notifications", idempotent.InboxConfig{MeterProvider: m.Provider})
	ctx := context.Background()
	for i := range 3 {
		receive(t, in, keyedEvent(t, fmt.Sprintf("cb_%d", i), 1))
	}
	if _, err := pool.Exec(ctx, `UPDATE inbox SET received_at = now() - interval '90 seconds'
		WHERE message_id = (SELECT message_id FROM inbox ORDER BY message_id LIMIT 1)`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE inbox SET status = 'FAILED' WHERE message_id = (SELECT message_id FROM inbox ORDER BY message_id DESC LIMIT 1)`); err != nil {
		t.Fatal(err)
	}
	b, err := in.Backlog(ctx)
	if err != nil || b.Pending != 2 || b.Failed != 1 || b.OldestPending < 90*time.Second || b.OldestPending > 100*time.Second {
		t.Fatalf("backlog %+v, %v; want 2 pending, 1 failed, oldest ~90s", b, err)
	}
	if got := m.Value(t, "inbox_oldest_pending_age_seconds", "consumer", "notifications"); got < 90 || got > 100 {
		t.Fatalf("inbox_oldest_pending_age_seconds = %v, want ~90", got)
	}
	if got := m.Value(t, "inbox_pending", "consumer", "notifications"); got != 2 {
		t.Fatalf("inbox_pending = %v, want 2", got)
	}
	if got := m.Value(t, "inbox_failed", "consumer", "notifications"); got != 1 {
		t.Fatalf("inbox_failed = %v, want 1", got)
	}
	all, err := idempotent.InboxBacklog(ctx, pool, "")
	if err != nil || len(all) != 1 || all[0].Consumer != "notifications" {
		t.Fatalf("InboxBacklog(all) = %+v, %v", all, err)
	}
}

// A key is busy while any of its rows runs: a v1 that arrives while v2's
// handler is still in flight becomes the key's head, but no other worker or
// replica may start it until v2's attempt has ended. Rows of one key are
// applied one at a time, whatever arrives meanwhile.
func TestInboxNeverRunsTwoRowsOfOneKeyAtOnce(t *testing.T) {
	t.Parallel()
	pool := inboxSetup(t)
	in := newInbox(t, pool, "notifications", idempotent.InboxConfig{})
	v1, v2 := keyedEvent(t, "cb_1", 1), keyedEvent(t, "cb_1", 2)
	var mu sync.Mutex
	inFlight, peak := 0, 0
	v2Running, releaseV2 := make(chan struct{}), make(chan struct{})
	var v2Once sync.Once
	h := func(ctx context.Context, tx pgx.Tx, e events.Envelope) error {
		mu.Lock()
		inFlight++
		peak = max(peak, inFlight)
		mu.Unlock()
		defer func() { mu.Lock(); inFlight--; mu.Unlock() }()
		if e.EventID == v2.EventID {
			v2Once.Do(func() { close(v2Running) })
			<-releaseV2
		}
		return record(ctx, tx, e)
	}
	receive(t, in, v2)
	runProcessors(t, pool, in, h, idempotent.ProcessorConfig{Workers: 2, BatchSize: 1, PollInterval: 5 * time.Millisecond}, 2)
	select {
	case <-v2Running:
	case <-time.After(5 * time.Second):
		t.Fatal("v2 never reached its handler")
	}
	receive(t, in, v1)
	time.Sleep(500 * time.Millisecond) // a hundred polls of four workers
	close(releaseV2)
	waitFor(t, 10*time.Second, "both DONE", func() bool {
		return count(t, pool, `SELECT count(*) FROM inbox WHERE status = 'DONE'`) == 2
	})
	mu.Lock()
	defer mu.Unlock()
	if peak != 1 {
		t.Fatalf("peak handlers in flight for one key = %d, want 1", peak)
	}
	if vs := appliedVersions(t, pool)["cb_1"]; !slices.Equal(vs, []int64{2, 1}) {
		t.Fatalf("applied %v, want [2 1]: v2 first (it was running), then the late v1", vs)
	}
}

// The inbox gauges do not query on every scrape: their values are cached
// for MetricsCacheTTL, and the counts stop at a bound, so a scrape costs the
// same however large the backlog.
func TestInboxGaugesAreCachedAndBounded(t *testing.T) {
	t.Parallel()
	defer idempotent.SetGaugeCap(5)()
	pool := inboxSetup(t)
	m := newMetrics()
	const ttl = 2 * time.Second // long enough that a receive and a scrape on a loaded machine fit in it
	in := newInbox(t, pool, "notifications", idempotent.InboxConfig{MeterProvider: m.Provider, MetricsCacheTTL: ttl})
	pending := func() float64 { return m.Value(t, "inbox_pending", "consumer", "notifications") }
	for i := range 3 {
		receive(t, in, keyedEvent(t, fmt.Sprintf("cb_%d", i), 1))
	}
	if got := pending(); got != 3 {
		t.Fatalf("inbox_pending = %v, want 3", got)
	}
	receive(t, in, keyedEvent(t, "cb_3", 1))
	if got := pending(); got != 3 {
		t.Fatalf("inbox_pending = %v right after the last scrape, want the cached 3", got)
	}
	time.Sleep(ttl + 50*time.Millisecond)
	if got := pending(); got != 4 {
		t.Fatalf("inbox_pending = %v once the cache expired, want 4", got)
	}
	for i := 4; i < 7; i++ {
		receive(t, in, keyedEvent(t, fmt.Sprintf("cb_%d", i), 1))
	}
	time.Sleep(ttl + 50*time.Millisecond)
	if got := pending(); got != 5 {
		t.Fatalf("inbox_pending = %v with 7 rows, want the bound 5", got)
	}
}
