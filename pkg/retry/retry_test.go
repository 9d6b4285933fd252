package retry

import (
	"math"
	"testing"
	"time"
)

// The default schedule doubles from 1s, caps at 5m, and every jittered
// delay stays within ±25% of the exact one (the table in the package doc).
func TestTheDefaultScheduleDoublesFromBaseToMaxWithinItsJitter(t *testing.T) {
	p := Policy{}.WithDefaults()
	cases := []struct {
		attempt   int
		exact     time.Duration
		low, high time.Duration
	}{
		{0, time.Second, 750 * time.Millisecond, 1250 * time.Millisecond},
		{1, time.Second, 750 * time.Millisecond, 1250 * time.Millisecond},
		{2, 2 * time.Second, 1500 * time.Millisecond, 2500 * time.Millisecond},
		{3, 4 * time.Second, 3 * time.Second, 5 * time.Second},
		{5, 16 * time.Second, 12 * time.Second, 20 * time.Second},
		{9, 256 * time.Second, 192 * time.Second, 320 * time.Second},
		{10, 5 * time.Minute, 225 * time.Second, 375 * time.Second},
		{45, 5 * time.Minute, 225 * time.Second, 375 * time.Second},
		{1000, 5 * time.Minute, 225 * time.Second, 375 * time.Second},
	}
	for _, c := range cases {
		if got := p.Exact(c.attempt); got != c.exact {
			t.Errorf("Exact(%d) = %v, want %v", c.attempt, got, c.exact)
		}
		var lo, hi time.Duration = 1 << 62, 0
		for range 2000 {
			d := p.Delay(c.attempt)
			if d < c.low || d > c.high {
				t.Fatalf("Delay(%d) = %v, outside [%v, %v]", c.attempt, d, c.low, c.high)
			}
			lo, hi = min(lo, d), max(hi, d)
		}
		// The draw really is spread, not pinned to one end.
		if spread := hi - lo; spread < (c.high-c.low)/2 {
			t.Errorf("Delay(%d) spread %v over 2000 draws, want at least half of %v", c.attempt, spread, c.high-c.low)
		}
	}
}

// WithDefaults fills only the zero fields; a caller's own values stay.
func TestWithDefaultsKeepsTheFieldsACallerSet(t *testing.T) {
	got := Policy{Max: 10 * time.Minute}.WithDefaults()
	want := Policy{Base: BaseDefault, Max: 10 * time.Minute, Jitter: JitterDefault}
	if got != want {
		t.Fatalf("WithDefaults = %+v, want %+v", got, want)
	}
}

// Without jitter the delay is exact: what a visibility timeout schedule uses.
func TestZeroJitterGivesTheExactSchedule(t *testing.T) {
	p := Policy{Base: time.Second, Max: 20 * time.Second}
	for attempt, want := range map[int]time.Duration{1: time.Second, 2: 2 * time.Second, 5: 16 * time.Second, 6: 20 * time.Second, 100: 20 * time.Second} {
		if got := p.Delay(attempt); got != want {
			t.Errorf("Delay(%d) = %v, want %v", attempt, got, want)
		}
	}
}

// A Walk steps along the schedule one failure at a time and starts over on Reset.
func TestAWalkStepsAlongTheScheduleAndResets(t *testing.T) {
	w := Policy{Base: 5 * time.Millisecond, Max: 20 * time.Millisecond}.BackOff()
	for i, want := range []time.Duration{5, 10, 20, 20} {
		if got := w.NextBackOff(); got != want*time.Millisecond {
			t.Fatalf("step %d: %v, want %v", i+1, got, want*time.Millisecond)
		}
	}
	w.Reset()
	if got := w.NextBackOff(); got != 5*time.Millisecond {
		t.Fatalf("after Reset: %v, want 5ms", got)
	}
}

// A Max near the longest Duration (a caller's "no cap") is reached by
// doubling without overflow: the schedule is min(Max, Base·2^(n-1)) for
// every attempt, never falling back to 0 (retry at once, for ever) once
// Base·2^(n-1) passes what an int64 holds.
func TestExactReachesAMaxNearTheLongestDurationWithoutOverflow(t *testing.T) {
	for _, p := range []Policy{
		{Base: time.Second, Max: math.MaxInt64},
		{Base: 3, Max: math.MaxInt64},
		{Base: time.Second, Max: 8e18},
		{Base: time.Hour, Max: math.MaxInt64/2 + 1},
	} {
		prev := time.Duration(0)
		for n := 1; n <= 200; n++ {
			want := p.Max
			if w := float64(p.Base) * math.Pow(2, float64(n-1)); w < float64(p.Max) {
				want = time.Duration(w)
			}
			got := p.Exact(n)
			if got != want {
				t.Fatalf("%+v: Exact(%d) = %v after Exact(%d) = %v, want %v", p, n, got, n-1, prev, want)
			}
			prev = got
		}
	}
}

// A jittered delay stays within ±Jitter of the exact one, capped at the
// longest Duration, even where Exact·(1+Jitter) is past what an int64
// holds: never a negative delay (retry at once) from a conversion that
// overflowed.
func TestDelayIsNeverNegativeNorOutsideItsJitterForAHugeMax(t *testing.T) {
	for _, p := range []Policy{
		{Base: time.Second, Max: 8e18, Jitter: 0.25},
		{Base: time.Second, Max: math.MaxInt64, Jitter: 1},
		{Base: time.Second, Max: math.MaxInt64, Jitter: math.NaN()},
	} {
		j := p.Jitter
		if math.IsNaN(j) {
			j = 0 // an undefined spread is none: the exact schedule
		}
		for n := 1; n <= 100; n++ {
			exact := float64(p.Exact(n))
			lo, hi := exact*(1-j), min(exact*(1+j), math.MaxInt64)
			for range 200 {
				d := p.Delay(n)
				if d < 0 || float64(d) < lo || float64(d) > hi {
					t.Fatalf("%+v: Delay(%d) = %v (%d ns), want within [%.0f, %.0f] ns", p, n, d, int64(d), lo, hi)
				}
			}
		}
	}
}
