// Package worker is the loop every background worker of the library runs:
// the outbox relay, the inbox processor and, in the services, the SMS
// sender. It imports the standard library and the OpenTelemetry metric API
// only.
//
// A worker makes passes. A pass claims some rows, works them and records
// the outcome, then says how many it handled and whether more is probably
// due. When more is due the loop goes again at once; otherwise it sleeps
// until a wake-up (a Signal) or the polling interval, whichever comes
// first. After a failed pass it sleeps the back-off the caller chose, and
// a wake-up ends that sleep only after its first second (or polling
// interval, if longer): while the queue is down, a wake-up per producer
// commit would otherwise make a pass per commit, but a wake-up after a
// database outage (its commit proves the database is back) still ends a
// long back-off within a second. A wake-up that comes during that first
// second is kept for the rest of the sleep.
//
// Wake-ups are hints, never the source of truth: one may be lost (a signal
// sent while the loop is busy is folded into one), or come from a row
// another replica already took, and the polling fallback still finds every
// due row. So a worker is correct with no Signal at all, only slower to
// react.
//
// On shutdown (the context given to Run ends) no new pass starts. A pass in
// progress keeps its own context for up to Config.Grace, so work that is
// about to commit is not thrown away; then its context is cancelled and Run
// returns once it has.
package worker

import (
	"context"
	"log/slog"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
)

// The defaults WithDefaults fills in.
const (
	// WorkersDefault is how many loops run the pass.
	WorkersDefault = 1
	// PollIntervalDefault is the sleep after a pass that left nothing due.
	PollIntervalDefault = time.Second
)

// Pass is one round of work of the loop numbered worker (0 to Workers-1;
// a pass may keep per-loop state, such as a cursor, indexed by it). It
// returns how many items it handled, for the metrics, and whether more is
// probably due, in which case the loop goes again without sleeping. A
// non-nil error is logged and counted, and the loop sleeps for the back-off.
type Pass func(ctx context.Context, worker int) (done int, more bool, err error)

// Config tunes Run. Zero values take the defaults in brackets.
type Config struct {
	// Name identifies the worker in logs and in the metrics' "worker"
	// attribute, for example "outbox-relay".
	Name string
	// Workers is how many loops run the pass concurrently [WorkersDefault].
	Workers int
	// PollInterval is the sleep after a pass that left nothing due
	// [PollIntervalDefault]: the polling fallback behind the wake-ups.
	PollInterval time.Duration
	// Wake, when set, ends the sleep of every idle loop at each Notify.
	Wake *Signal
	// Backoff, when set, is the sleep after a failed pass, given how many
	// passes of this loop failed in a row (1, 2, ...) and the last error;
	// for example a growing delay while the database is unreachable. Nil,
	// or a result of zero or less: PollInterval. A wake-up ends it only
	// after its first max(PollInterval, 1 s).
	Backoff func(failures int, err error) time.Duration
	// Grace is how long a pass in progress may go on after the context of
	// Run ends [0: its context ends with Run's].
	Grace time.Duration
	// Logger receives a line per failed pass and the shutdown warning
	// [slog.Default()].
	Logger *slog.Logger
	// MeterProvider receives the metrics [the global one].
	MeterProvider metric.MeterProvider
}

// WithDefaults returns c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	if c.Workers <= 0 {
		c.Workers = WorkersDefault
	}
	if c.PollInterval <= 0 {
		c.PollInterval = PollIntervalDefault
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.MeterProvider == nil {
		c.MeterProvider = otel.GetMeterProvider()
	}
	return c
}

// meterName names this package's instrumentation (meter, tracer) by its import
// path, read from the compiled package rather than written out, so that a
// copy under another module path (gonew) names itself.
var meterName = reflect.TypeFor[Config]().PkgPath()

// Run runs cfg.Workers loops of pass until ctx ends, lets the passes in
// progress finish (up to cfg.Grace) and returns nil. Its metrics, each
// with the attribute worker=cfg.Name:
//
//   - worker.passes (counter), with outcome = "worked" (the pass handled
//     items), "idle" (nothing was due) or "failed";
//   - worker.items (counter): the items the passes handled;
//   - worker.pass.duration (histogram, seconds).
func Run(ctx context.Context, cfg Config, pass Pass) error {
	cfg = cfg.WithDefaults()
	m := newMeters(cfg)
	// Passes outlive ctx by up to Grace.
	work, stopWork := ctx, context.CancelFunc(func() {})
	if cfg.Grace > 0 {
		work, stopWork = context.WithCancel(context.WithoutCancel(ctx))
		defer stopWork()
	}
	var wg sync.WaitGroup
	for i := range cfg.Workers {
		var sub *subscriber
		if cfg.Wake != nil {
			var unsubscribe func()
			sub, unsubscribe = cfg.Wake.subscribe()
			defer unsubscribe()
		}
		wg.Go(func() { loop(ctx, work, cfg, m, sub, i, pass) })
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
	}
	if cfg.Grace <= 0 {
		<-done
		return nil
	}
	grace := time.NewTimer(cfg.Grace)
	defer grace.Stop()
	select {
	case <-done:
	case <-grace.C:
		cfg.Logger.Warn(cfg.Name+": shutdown grace over, cancelling the passes in progress; their work will be retried",
			"grace", cfg.Grace)
		stopWork()
		<-done
	}
	return nil
}

func loop(ctx, work context.Context, cfg Config, m *meters, sub *subscriber, i int, pass Pass) {
	var wake <-chan struct{} // nil without a Signal: never ready
	if sub != nil {
		wake = sub.ch
	}
	// Stopped until the first sleep: a timer that fired unread would, in
	// a module on the timer semantics of Go 1.22 and before, end that
	// sleep at once.
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	failures := 0
	for ctx.Err() == nil {
		start := time.Now()
		n, more, err := pass(work, i)
		m.record(work, cfg.Name, time.Since(start), n, err)
		if ctx.Err() != nil {
			return
		}
		wait := cfg.PollInterval
		if err != nil {
			failures++
			cfg.Logger.Error(cfg.Name+": pass failed", "error", err, "failures_in_a_row", failures)
			if cfg.Backoff != nil {
				if b := cfg.Backoff(failures, err); b > 0 {
					wait = b
				}
			}
			deaf := min(wait, max(cfg.PollInterval, time.Second))
			if !sleep(ctx, timer, deaf, nil) {
				continue
			}
			if wait -= deaf; wait <= 0 {
				continue
			}
		} else {
			failures = 0
			if more {
				continue
			}
		}
		sub.setIdle(true)
		sleep(ctx, timer, wait, wake)
		sub.setIdle(false)
	}
}

// sleep waits d on timer (stopped, its channel empty), or less if ctx ends
// or wake is ready; it reports whether the whole d passed. It leaves timer
// stopped with its channel empty.
func sleep(ctx context.Context, timer *time.Timer, d time.Duration, wake <-chan struct{}) bool {
	timer.Reset(d)
	select {
	case <-timer.C:
		return true
	case <-ctx.Done():
	case <-wake:
	}
	if !timer.Stop() {
		// It fired as the sleep ended; on the old timer semantics its tick
		// waits in the channel and would end the next sleep.
		select {
		case <-timer.C:
		default:
		}
	}
	return false
}

// Signal wakes the idle loops that subscribed to it (Config.Wake). The zero
// value is ready to use, and it is safe for concurrent use. A Notify with
// no loop subscribed, or sent to a loop that is busy, is not queued beyond
// one pending wake-up per loop.
type Signal struct {
	mu   sync.Mutex
	subs map[*subscriber]struct{}
}

// subscriber is one loop's end of a Signal: its wake-up channel (one
// pending wake-up at most) and whether the loop sleeps.
type subscriber struct {
	ch   chan struct{}
	idle atomic.Bool
}

// setIdle records whether the loop sleeps; a nil subscriber (no Signal)
// ignores it.
func (s *subscriber) setIdle(v bool) {
	if s != nil {
		s.idle.Store(v)
	}
}

// post gives s a pending wake-up unless it has one; it reports whether it
// did.
func (s *subscriber) post() bool {
	select {
	case s.ch <- struct{}{}:
		return true
	default: // already has a wake-up pending
		return false
	}
}

// Notify wakes every subscribed loop that sleeps, and makes every busy one
// skip its next sleep. It never blocks. Use it when the news is for every
// loop (a backlog to share out, a batch of rows).
func (s *Signal) Notify() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for sub := range s.subs {
		sub.post()
	}
}

// NotifyOne wakes one subscribed loop that sleeps, for news that one pass
// can take (one row stored): waking every loop for it would have all but
// one of them pass for nothing, on the cores the one that works needs. When
// no loop sleeps, one busy loop skips its next sleep instead; when every
// loop already has a wake-up pending, there is nothing to add. So, as with
// Notify, the news is never lost while a loop is subscribed: some loop
// makes a pass after it. It never blocks.
func (s *Signal) NotifyOne() {
	s.mu.Lock()
	defer s.mu.Unlock()
	// Map order varies from call to call, which spreads the wake-ups over
	// the loops.
	for sub := range s.subs {
		if sub.idle.Load() && sub.post() {
			return
		}
	}
	for sub := range s.subs {
		if sub.post() {
			return
		}
	}
}

func (s *Signal) subscribe() (*subscriber, func()) {
	sub := &subscriber{ch: make(chan struct{}, 1)}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.subs == nil {
		s.subs = map[*subscriber]struct{}{}
	}
	s.subs[sub] = struct{}{}
	return sub, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		delete(s.subs, sub)
	}
}

type meters struct {
	passes, items metric.Int64Counter
	duration      metric.Float64Histogram
}

func newMeters(cfg Config) *meters {
	meter := cfg.MeterProvider.Meter(meterName)
	// An instrument that cannot be built is replaced by a no-op one:
	// metrics never stop a worker.
	fallback := noop.Meter{}
	warn := func(name string, err error) {
		cfg.Logger.Warn(cfg.Name+": metric "+name+" unavailable", "error", err)
	}
	var m meters
	var err error
	if m.passes, err = meter.Int64Counter("worker.passes", metric.WithDescription("passes of a background worker, by outcome")); err != nil {
		warn("worker.passes", err)
		m.passes, _ = fallback.Int64Counter("")
	}
	if m.items, err = meter.Int64Counter("worker.items", metric.WithDescription("items a background worker's passes handled")); err != nil {
		warn("worker.items", err)
		m.items, _ = fallback.Int64Counter("")
	}
	if m.duration, err = meter.Float64Histogram("worker.pass.duration", metric.WithUnit("s"),
		metric.WithDescription("duration of one pass of a background worker")); err != nil {
		warn("worker.pass.duration", err)
		m.duration, _ = fallback.Float64Histogram("")
	}
	return &m
}

func (m *meters) record(ctx context.Context, name string, took time.Duration, n int, err error) {
	outcome := "idle"
	switch {
	case err != nil:
		outcome = "failed"
	case n > 0:
		outcome = "worked"
	}
	// A context that ended still records: the pass happened.
	ctx = context.WithoutCancel(ctx)
	w := attribute.String("worker", name)
	m.passes.Add(ctx, 1, metric.WithAttributes(w, attribute.String("outcome", outcome)))
	if n > 0 {
		m.items.Add(ctx, int64(n), metric.WithAttributes(w))
	}
	m.duration.Record(ctx, took.Seconds(), metric.WithAttributes(w))
}
