package retry

import (
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
