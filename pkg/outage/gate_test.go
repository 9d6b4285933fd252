package outage

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// closedGate is a gate on probe, closed by a refused connection that the
// probe's first call confirms.
func closedGate(t *testing.T, probe Probe, cfg GateConfig) *Gate {
	t.Helper()
	cfg.Probe = probe
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	g, err := NewGate(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !g.Suspect(context.Background(), syscall.ECONNREFUSED) {
		t.Fatal("a refused connection that the probe confirms did not close the gate")
	}
	return g
}

// A probe stuck in a call that does not watch its context (a hung TCP
// read, a client without a deadline) must not hold the consumer that
// waits: Wait returns when its context ends, each hung probe counts as
// failed once ProbeTimeout is over (so the gate is probed again, not left
// "probing" for ever), and a probe that answers again reopens the gate.
func TestWaitReturnsAtItsDeadlineWhileTheProbeHangs(t *testing.T) {
	var hung atomic.Bool
	hung.Store(true)
	var probes atomic.Int64
	release := make(chan struct{})
	defer close(release)
	g := closedGate(t, func(context.Context) error {
		switch {
		case probes.Add(1) == 1:
			return syscall.ECONNREFUSED // Suspect's probe, which closes the gate
		case hung.Load():
			<-release // ignores its context
		}
		return nil
	}, GateConfig{ProbeTimeout: 50 * time.Millisecond, ProbeBase: 10 * time.Millisecond, ProbeMax: 10 * time.Millisecond})

	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	errc := make(chan error, 1)
	go func() { errc <- g.Wait(ctx) }()
	select {
	case err := <-errc:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Wait = %v, want the context's deadline", err)
		}
		if took := time.Since(start); took > time.Second {
			t.Errorf("Wait returned %v after its 300ms context", took.Round(time.Millisecond))
		}
	case <-time.After(3 * time.Second):
		t.Fatal("Wait still blocked 3s after its 300ms context ended, with a 50ms ProbeTimeout: the hung probe holds it")
	}
	// 300ms of 50ms timeouts with 10ms between: the hung probes were given
	// up on and tried again, not waited for.
	if n := probes.Load(); n < 3 {
		t.Errorf("%d probes in 300ms with ProbeTimeout 50ms: a hung probe was not given up on", n)
	}
	if !g.Closed() {
		t.Fatal("a gate whose probes hang reopened")
	}

	hung.Store(false) // the dependency answers again
	ctx, cancel = context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := g.Wait(ctx); err != nil || g.Closed() {
		t.Fatalf("Wait = %v, closed = %v once the probe answers again: want the gate open", err, g.Closed())
	}
}

// A probe that panics (a bug in it) is a failed probe: Wait does not
// panic in the consumer's loop, and the gate is probed again and reopens
// once the probe answers, instead of staying "probing", and so closed, for
// ever.
func TestAPanickingProbeCountsAsFailedAndTheGateReopensOnceItAnswers(t *testing.T) {
	var mode atomic.Int32 // 0 refuse, 1 panic, 2 answer
	var panics atomic.Int64
	g := closedGate(t, func(context.Context) error {
		switch mode.Load() {
		case 0:
			return syscall.ECONNREFUSED
		case 1:
			panics.Add(1)
			panic("probe bug")
		}
		return nil
	}, GateConfig{ProbeBase: 10 * time.Millisecond, ProbeMax: 10 * time.Millisecond})
	mode.Store(1)

	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	var err error
	panicked := func() (p any) {
		defer func() { p = recover() }()
		err = g.Wait(ctx)
		return nil
	}()
	if panicked != nil {
		t.Errorf("Wait panicked with the probe's %q, want the panic counted as a failed probe", panicked)
	} else if !errors.Is(err, context.DeadlineExceeded) || !g.Closed() {
		t.Errorf("Wait = %v, closed = %v while the probe panics: want the deadline and the gate closed", err, g.Closed())
	}
	if n := panics.Load(); n < 2 && panicked == nil {
		t.Errorf("%d probes in 200ms with ProbeMax 10ms: the panicking probe was not tried again", n)
	}

	mode.Store(2) // the dependency is back and the probe is fine
	ctx, cancel = context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := g.Wait(ctx); err != nil || g.Closed() {
		t.Fatalf("Wait = %v, closed = %v a second after the probe answers: want the gate open", err, g.Closed())
	}
}

// ProbeMax is the longest a closed gate goes between two probes, so the
// longest an outage that is over goes unnoticed: the jitter spreads the
// probes below it, never above. Every one of many failed probes schedules
// the next within ProbeMax, and the draws are still spread.
func TestAClosedGateNeverSchedulesItsNextProbeFartherThanProbeMax(t *testing.T) {
	const probeMax = 200 * time.Millisecond
	g := closedGate(t, func(context.Context) error { return syscall.ECONNREFUSED },
		GateConfig{ProbeBase: probeMax, ProbeMax: probeMax})
	lo, hi := time.Duration(1<<62), time.Duration(0)
	for range 10000 {
		g.finishProbe(syscall.ECONNREFUSED)
		g.mu.Lock()
		gap := time.Until(g.nextProbe) // at most the drawn delay: time.Now() came first
		g.probing = true               // as Wait sets it before the next probe
		g.mu.Unlock()
		if gap > probeMax {
			t.Fatalf("the next probe is %v away with ProbeMax %v: a recovery could go unnoticed longer than ProbeMax", gap, probeMax)
		}
		lo, hi = min(lo, gap), max(hi, gap)
	}
	if hi-lo < probeMax/10 {
		t.Errorf("the probes were scheduled between %v and %v: the jitter no longer spreads them", lo, hi)
	}
}
