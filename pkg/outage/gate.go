package outage

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"runtime/debug"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/effectively-once/payments-cashback/pkg/retry"
)

// Probe asks a dependency whether it answers (pgxpool.Pool.Ping, a
// GetQueueUrl). It must be cheap and must not depend on any one message.
type Probe func(ctx context.Context) error

// GateConfig configures a Gate. Zero values take the defaults in brackets.
type GateConfig struct {
	// Name is what the gate guards, for logs, readiness and metrics ["dependency"].
	Name string
	// Probe is required. It runs in a goroutine of its own; a panic in it
	// is logged and counts as a failed probe.
	Probe Probe
	// ProbeTimeout bounds one probe [2s]: a probe that has not returned by
	// then counts as failed, even if it ignores its context.
	ProbeTimeout time.Duration
	// ProbeBase and ProbeMax space the probes of a closed gate:
	// min(ProbeMax, ProbeBase*2^n), jittered ±25% (the retry package's
	// schedule) and then capped at ProbeMax [250ms, 5s]. No two probes of
	// a waiting consumer are farther apart than ProbeMax (end of one to
	// start of the next), so an outage that is over goes unnoticed for at
	// most ProbeMax plus the one probe in flight when it ended.
	ProbeBase, ProbeMax time.Duration
	Logger              *slog.Logger
}

// Gate is open while its dependency answers and closed during an outage.
// Consumers Wait on it before taking new work and report their failures to
// Suspect. All methods are safe for concurrent use; a nil *Gate is always
// open and never suspects anything, so code may call it unconditionally.
type Gate struct {
	cfg GateConfig
	log *slog.Logger

	mu        sync.Mutex
	closed    bool
	since     time.Time     // when it closed
	lastErr   error         // the last failed probe
	opened    chan struct{} // closed when the gate reopens
	probing   bool
	nextProbe time.Time
	failures  int // consecutive failed probes while closed

	outages metric.Int64Counter
}

// NewGate returns an open gate.
func NewGate(cfg GateConfig) (*Gate, error) {
	if cfg.Probe == nil {
		return nil, errors.New("outage: GateConfig.Probe is nil")
	}
	if cfg.Name == "" {
		cfg.Name = "dependency"
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&cfg.ProbeTimeout, 2*time.Second)
	def(&cfg.ProbeBase, 250*time.Millisecond)
	def(&cfg.ProbeMax, 5*time.Second)
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	g := &Gate{cfg: cfg, log: cfg.Logger.With("gate", cfg.Name)}
	m := otel.Meter(otelScope)
	var err error
	if g.outages, err = m.Int64Counter("outage_gate_closed_total",
		metric.WithDescription("Outages confirmed by a failed probe: the consumer stopped receiving until the dependency answered.")); err != nil {
		return nil, err
	}
	attr := metric.WithAttributes(attribute.String("gate", cfg.Name))
	g.outages.Add(context.Background(), 0, attr)
	if _, err = m.Int64ObservableGauge("outage_gate_closed",
		metric.WithDescription("1 while the gate is closed (its dependency unreachable), else 0."),
		metric.WithInt64Callback(func(_ context.Context, o metric.Int64Observer) error {
			v := int64(0)
			if g.Closed() {
				v = 1
			}
			o.Observe(v, attr)
			return nil
		})); err != nil {
		return nil, err
	}
	return g, nil
}

// Suspect is told a failed handler's error and reports whether it is an
// outage: err is Unavailable and the dependency fails a probe as well (or
// the gate is already closed). The gate is then closed until a probe
// succeeds. An error the probe does not confirm returns false: the
// failure is the message's own.
func (g *Gate) Suspect(ctx context.Context, err error) bool {
	if g == nil || !Unavailable(err) {
		return false
	}
	g.mu.Lock()
	closed := g.closed
	g.mu.Unlock()
	if closed {
		return true
	}
	perr := g.probe(ctx)
	if perr == nil {
		return false
	}
	if ctx.Err() != nil {
		return false // our own shutdown, not the dependency's fault
	}
	g.close(err, perr)
	return true
}

// probe runs one probe and returns its error, or an error of its own once
// ProbeTimeout is over or ctx ends, whichever comes first, whether or not
// the probe watches its context. The probe runs in a goroutine of its own,
// so one stuck in a call that ignores its context (a hung read, a client
// without a deadline) holds no caller; it is left to return in the
// background and its result is dropped. A probe that panics (a bug in it)
// is logged and counts as failed: the panic is not the caller's, and a
// gate left "probing" by it would never be probed, or reopen, again.
func (g *Gate) probe(ctx context.Context) error {
	pctx, cancel := context.WithTimeout(ctx, g.cfg.ProbeTimeout)
	defer cancel()
	done := make(chan error, 1) // buffered: a probe given up on still returns
	go func() {
		defer func() {
			if p := recover(); p != nil {
				g.log.Error("probe panicked: counted as a failed probe", "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
				done <- fmt.Errorf("outage: probe of %s panicked: %v", g.cfg.Name, p)
			}
		}()
		done <- g.cfg.Probe(pctx)
	}()
	select {
	case err := <-done:
		return err
	case <-pctx.Done():
		select {
		case err := <-done: // it returned as its time ran out
			return err
		default:
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("outage: probe of %s did not return within ProbeTimeout (%v): %w", g.cfg.Name, g.cfg.ProbeTimeout, pctx.Err())
	}
}

func (g *Gate) close(cause, perr error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return
	}
	g.closed, g.since, g.lastErr, g.failures = true, time.Now(), perr, 1
	g.opened = make(chan struct{})
	g.nextProbe = time.Now().Add(g.cfg.ProbeBase)
	g.outages.Add(context.Background(), 1, metric.WithAttributes(attribute.String("gate", g.cfg.Name)))
	g.log.Error("dependency unavailable: pausing until it answers", "error", cause, "probe_error", perr)
}

// Wait returns nil at once while the gate is open. While it is closed, it
// blocks, probing the dependency with backoff (one waiter probes at a
// time), until a probe succeeds (nil) or ctx ends (ctx.Err()). A probe
// that has not returned within ProbeTimeout counts as failed, and one that
// has not returned when ctx ends is abandoned, whether or not it watches
// its context: a hung probe holds neither this waiter nor the others. An
// abandoned probe keeps its goroutine until it returns, so a Probe should
// still honour its context. A probe that panics counts as failed too (the
// panic is logged, not raised in the waiter).
func (g *Gate) Wait(ctx context.Context) error {
	if g == nil {
		return nil
	}
	for {
		g.mu.Lock()
		if !g.closed {
			g.mu.Unlock()
			return nil
		}
		opened := g.opened
		wait := time.Until(g.nextProbe)
		mine := !g.probing && wait <= 0
		if mine {
			g.probing = true
		}
		g.mu.Unlock()
		if mine {
			err := g.probe(ctx)
			if err != nil && ctx.Err() != nil {
				// Our own context ended, not the dependency: no failure to
				// count, and the next waiter may probe at once.
				g.mu.Lock()
				g.probing = false
				g.mu.Unlock()
				return ctx.Err()
			}
			g.finishProbe(err)
			continue
		}
		if wait <= 0 {
			wait = g.cfg.ProbeBase // another waiter is probing
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-opened:
		case <-t.C:
		}
		t.Stop()
	}
}

func (g *Gate) finishProbe(err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.probing = false
	if !g.closed {
		return
	}
	if err == nil {
		g.closed = false
		close(g.opened)
		g.log.Info("dependency answers again: resuming", "outage", time.Since(g.since).Round(time.Millisecond).String())
		return
	}
	g.lastErr = err
	// The jitter may draw up to 25% above ProbeMax: capped, so that
	// ProbeMax stays the longest a recovery goes unnoticed.
	d := min(g.cfg.ProbeMax, retry.Policy{Base: g.cfg.ProbeBase, Max: g.cfg.ProbeMax, Jitter: retry.JitterDefault}.Delay(g.failures+1))
	g.failures++
	g.nextProbe = time.Now().Add(d)
}

// Closed reports whether the gate is closed (an outage is in progress).
func (g *Gate) Closed() bool {
	if g == nil {
		return false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.closed
}

// Check is a readiness check: nil while the gate is open, an error naming
// the dependency and how long it has been unreachable while it is closed.
// It carries no internal error text (readiness bodies are public).
func (g *Gate) Check(context.Context) error {
	if g == nil {
		return nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.closed {
		return nil
	}
	return fmt.Errorf("paused: %s unreachable for %v", g.cfg.Name, time.Since(g.since).Round(time.Second))
}

// otelScope names this package's instrumentation (meter, tracer) by its import
// path, read from the compiled package rather than written out, so that a
// copy under another module path (gonew) names itself.
var otelScope = reflect.TypeFor[Gate]().PkgPath()
