package worker

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// start runs Run in the background; stop cancels it and waits for it.
func start(t *testing.T, cfg Config, pass Pass) (stop func()) {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = quiet
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, cfg, pass) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Run returned %v, want nil on cancellation", err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("Run did not return after its context ended")
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// waitFor polls cond for up to 5 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestAPassThatSaysMoreRunsAgainWithoutSleeping(t *testing.T) {
	var passes atomic.Int64
	start(t, Config{PollInterval: time.Hour}, func(context.Context, int) (int, bool, error) {
		n := passes.Add(1)
		return 1, n < 50, nil
	})
	waitFor(t, "50 passes", func() bool { return passes.Load() >= 50 })
	time.Sleep(50 * time.Millisecond)
	if got := passes.Load(); got != 50 {
		t.Fatalf("%d passes, want exactly 50: the 50th said nothing more is due, so the loop must sleep (an hour)", got)
	}
}

func TestNotifyWakesAnIdleLoopAndPollingIsTheFallback(t *testing.T) {
	var sig Signal
	var passes atomic.Int64
	start(t, Config{PollInterval: time.Hour, Wake: &sig}, func(context.Context, int) (int, bool, error) {
		passes.Add(1)
		return 0, false, nil
	})
	waitFor(t, "the first pass", func() bool { return passes.Load() == 1 })
	time.Sleep(20 * time.Millisecond)
	if got := passes.Load(); got != 1 {
		t.Fatalf("%d passes before any wake-up, want 1", got)
	}
	sig.Notify()
	waitFor(t, "the pass after Notify", func() bool { return passes.Load() == 2 })

	var polled atomic.Int64
	start(t, Config{PollInterval: 10 * time.Millisecond}, func(context.Context, int) (int, bool, error) {
		polled.Add(1)
		return 0, false, nil
	})
	waitFor(t, "passes driven by polling alone", func() bool { return polled.Load() >= 5 })
}

func TestNotifyWithoutSubscribersAndAfterStopNeverBlocks(t *testing.T) {
	var sig Signal
	sig.Notify() // zero value, nobody subscribed
	stop := start(t, Config{Workers: 3, PollInterval: time.Hour, Wake: &sig}, func(context.Context, int) (int, bool, error) {
		return 0, false, nil
	})
	stop()
	for range 10 {
		sig.Notify()
	}
	sig.mu.Lock()
	defer sig.mu.Unlock()
	if len(sig.subs) != 0 {
		t.Fatalf("%d subscriptions left after Run returned, want 0", len(sig.subs))
	}
}

func TestEveryLoopHasItsOwnIndexAndRunsConcurrently(t *testing.T) {
	const workers = 4
	var mu sync.Mutex
	seen := map[int]bool{}
	inside := make(chan struct{}, workers)
	release := make(chan struct{})
	start(t, Config{Workers: workers, PollInterval: time.Hour}, func(ctx context.Context, i int) (int, bool, error) {
		mu.Lock()
		first := !seen[i]
		seen[i] = true
		mu.Unlock()
		if first {
			inside <- struct{}{}
			select { // every loop holds its first pass until all are inside
			case <-release:
			case <-ctx.Done():
			}
		}
		return 0, false, nil
	})
	for range workers {
		select {
		case <-inside:
		case <-time.After(5 * time.Second):
			t.Fatalf("only some of %d loops entered a pass at the same time", workers)
		}
	}
	close(release)
	mu.Lock()
	defer mu.Unlock()
	for i := range workers {
		if !seen[i] {
			t.Errorf("no pass ran with index %d", i)
		}
	}
}

func TestBackoffCountsFailuresInARowAndSuccessResetsIt(t *testing.T) {
	errDown := errors.New("database down")
	var mu sync.Mutex
	var got []int
	var passes atomic.Int64
	start(t, Config{PollInterval: time.Hour,
		Backoff: func(failures int, err error) time.Duration {
			if !errors.Is(err, errDown) {
				t.Errorf("Backoff got %v, want the pass's error", err)
			}
			mu.Lock()
			got = append(got, failures)
			mu.Unlock()
			return time.Millisecond
		}}, func(context.Context, int) (int, bool, error) {
		switch passes.Add(1) {
		case 1, 2, 3, 5, 6:
			return 0, false, errDown
		case 4:
			return 1, true, nil // a success: the count starts again
		}
		return 0, false, nil // then sleep an hour
	})
	waitFor(t, "7 passes", func() bool { return passes.Load() >= 7 })
	mu.Lock()
	defer mu.Unlock()
	want := []int{1, 2, 3, 1, 2}
	if len(got) != len(want) {
		t.Fatalf("Backoff saw %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("Backoff saw %v, want %v", got, want)
		}
	}
}

func TestAPassInProgressKeepsItsContextForTheGraceThenIsCancelled(t *testing.T) {
	for _, tc := range []struct {
		name       string
		grace      time.Duration
		passTakes  time.Duration
		wantFinish bool
	}{
		{"finishes within the grace", 2 * time.Second, 50 * time.Millisecond, true},
		{"cut at the end of the grace", 50 * time.Millisecond, time.Hour, false},
		{"no grace: cancelled with Run", 0, time.Hour, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			entered := make(chan struct{})
			var finished, cancelled atomic.Bool
			var once sync.Once
			stop := start(t, Config{PollInterval: time.Hour, Grace: tc.grace}, func(ctx context.Context, _ int) (int, bool, error) {
				once.Do(func() { close(entered) })
				select {
				case <-time.After(tc.passTakes):
					finished.Store(true)
				case <-ctx.Done():
					cancelled.Store(true)
				}
				return 1, false, nil
			})
			<-entered
			began := time.Now()
			stop()
			if finished.Load() != tc.wantFinish || cancelled.Load() == tc.wantFinish {
				t.Fatalf("finished %v, cancelled %v; want finished %v", finished.Load(), cancelled.Load(), tc.wantFinish)
			}
			if !tc.wantFinish && tc.grace > 0 && time.Since(began) < tc.grace {
				t.Fatalf("the pass was cancelled after %v, before its grace of %v", time.Since(began), tc.grace)
			}
		})
	}
}

func TestNoPassStartsAfterTheContextEnds(t *testing.T) {
	var passes atomic.Int64
	stop := start(t, Config{PollInterval: time.Millisecond, Grace: time.Second}, func(context.Context, int) (int, bool, error) {
		passes.Add(1)
		return 1, true, nil
	})
	waitFor(t, "some passes", func() bool { return passes.Load() > 10 })
	stop()
	after := passes.Load()
	time.Sleep(20 * time.Millisecond)
	if got := passes.Load(); got != after {
		t.Fatalf("%d passes ran after Run returned", got-after)
	}
}

func TestMetricsCountPassesByOutcomeAndItems(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	var passes atomic.Int64
	start(t, Config{Name: "test-worker", PollInterval: time.Millisecond, MeterProvider: mp,
		Backoff: func(int, error) time.Duration { return time.Millisecond }},
		func(ctx context.Context, _ int) (int, bool, error) {
			switch passes.Add(1) {
			case 1:
				return 7, true, nil
			case 2:
				return 0, false, errors.New("boom")
			case 3:
				return 0, false, nil
			}
			<-ctx.Done() // park: no more passes to count
			return 0, false, nil
		})
	waitFor(t, "the fourth pass", func() bool { return passes.Load() == 4 })
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	byOutcome := map[string]int64{}
	var items int64
	var durations uint64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					if w, _ := p.Attributes.Value("worker"); w.AsString() != "test-worker" {
						t.Errorf("%s has worker=%q, want test-worker", m.Name, w.AsString())
					}
					if m.Name == "worker.passes" {
						o, _ := p.Attributes.Value("outcome")
						byOutcome[o.AsString()] += p.Value
					} else if m.Name == "worker.items" {
						items += p.Value
					}
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					durations += p.Count
				}
			}
		}
	}
	if byOutcome["worked"] != 1 || byOutcome["failed"] != 1 || byOutcome["idle"] != 1 || items != 7 || durations != 3 {
		t.Fatalf("passes %v, items %d, durations %d; want worked 1, failed 1, idle 1, items 7, durations 3", byOutcome, items, durations)
	}
}

// allIdle reports whether every loop subscribed to sig sleeps.
func allIdle(sig *Signal, n int) bool {
	sig.mu.Lock()
	defer sig.mu.Unlock()
	idle := 0
	for sub := range sig.subs {
		if sub.idle.Load() {
			idle++
		}
	}
	return idle == n
}

func TestNotifyOneWakesOneSleepingLoopNotifyWakesAll(t *testing.T) {
	var sig Signal
	var passes atomic.Int64
	start(t, Config{Workers: 4, PollInterval: time.Hour, Wake: &sig}, func(context.Context, int) (int, bool, error) {
		passes.Add(1)
		return 0, false, nil
	})
	waitFor(t, "4 loops asleep after their first pass", func() bool { return passes.Load() == 4 && allIdle(&sig, 4) })
	sig.NotifyOne()
	waitFor(t, "the pass after NotifyOne", func() bool { return passes.Load() == 5 })
	time.Sleep(50 * time.Millisecond)
	if got := passes.Load(); got != 5 {
		t.Fatalf("%d passes after one NotifyOne, want 5: one loop woken, not %d", got, got-4)
	}
	waitFor(t, "4 loops asleep again", func() bool { return allIdle(&sig, 4) })
	sig.Notify()
	waitFor(t, "a pass of every loop after Notify", func() bool { return passes.Load() == 9 })
}

// With every loop busy, a NotifyOne is not lost: one loop passes again
// after its current pass instead of sleeping.
func TestNotifyOneWhileEveryLoopIsBusyMakesOneMorePass(t *testing.T) {
	var sig Signal
	var passes atomic.Int64
	release := make(chan struct{})
	start(t, Config{Workers: 2, PollInterval: time.Hour, Wake: &sig}, func(ctx context.Context, _ int) (int, bool, error) {
		if passes.Add(1) <= 2 {
			select { // the first pass of each loop waits for the test
			case <-release:
			case <-ctx.Done():
			}
		}
		return 0, false, nil
	})
	waitFor(t, "both loops in their first pass", func() bool { return passes.Load() == 2 })
	sig.NotifyOne()
	close(release)
	waitFor(t, "the pass the NotifyOne asked for", func() bool { return passes.Load() == 3 })
	time.Sleep(50 * time.Millisecond)
	if got := passes.Load(); got != 3 {
		t.Fatalf("%d passes, want 3: one loop passes again, the other sleeps", got)
	}
}

// A wake-up does not end the back-off after a failed pass: while the
// database is down, every producer's commit notifying the relay would
// otherwise turn the back-off into a pass per commit. The wake-up is kept,
// so the pass after the back-off is not delayed by the polling interval.
func TestAWakeUpDoesNotCutTheBackoffShort(t *testing.T) {
	var wake Signal
	var passes atomic.Int64
	start(t, Config{PollInterval: time.Hour, Wake: &wake,
		Backoff: func(int, error) time.Duration { return 300 * time.Millisecond }},
		func(context.Context, int) (int, bool, error) {
			if passes.Add(1) == 1 {
				return 0, false, errors.New("database down")
			}
			return 0, false, nil
		})
	waitFor(t, "the failed pass", func() bool { return passes.Load() == 1 })
	for range 50 {
		wake.Notify()
		time.Sleep(2 * time.Millisecond)
	}
	if n := passes.Load(); n != 1 {
		t.Fatalf("%d passes during the back-off, want only the failed one", n)
	}
	waitFor(t, "the pass after the back-off", func() bool { return passes.Load() >= 2 })
}

// A Backoff that returns zero or less (an overflow in a caller's formula,
// say) sleeps the polling interval: it does not make the loop spin.
func TestABackoffOfZeroOrLessSleepsThePollingInterval(t *testing.T) {
	for _, d := range []time.Duration{0, -time.Second} {
		var passes atomic.Int64
		stop := start(t, Config{PollInterval: 100 * time.Millisecond,
			Backoff: func(int, error) time.Duration { return d }},
			func(context.Context, int) (int, bool, error) {
				passes.Add(1)
				return 0, false, errors.New("down")
			})
		time.Sleep(250 * time.Millisecond)
		stop()
		if n := passes.Load(); n > 4 {
			t.Errorf("Backoff %v: %d failed passes in 250 ms, want at most 4 with a 100 ms polling interval", d, n)
		}
	}
}

// A long back-off still ends soon after the cause is gone: a wake-up (a
// producer's commit, which the database must be up to make) ends it after
// its first second, not at its end, and not before.
func TestAWakeUpEndsALongBackoffAfterItsFirstSecond(t *testing.T) {
	var wake Signal
	var passes atomic.Int64
	failed := make(chan time.Time, 1)
	start(t, Config{PollInterval: 50 * time.Millisecond, Wake: &wake,
		Backoff: func(int, error) time.Duration { return time.Hour }},
		func(context.Context, int) (int, bool, error) {
			if passes.Add(1) == 1 {
				failed <- time.Now()
				return 0, false, errors.New("database down")
			}
			return 0, false, nil
		})
	at := <-failed
	done := make(chan struct{})
	defer close(done)
	go func() {
		for {
			select {
			case <-done:
				return
			case <-time.After(5 * time.Millisecond):
				wake.Notify()
			}
		}
	}()
	waitFor(t, "a pass after the back-off's first second", func() bool { return passes.Load() >= 2 })
	if el := time.Since(at); el < 900*time.Millisecond {
		t.Fatalf("the wake-ups ended the back-off after %v, want after its first second", el)
	}
}
