// Package retry is the one back-off schedule of the library: the relay's
// failed sends, the inbox processor's failed handlers, the subscriber's
// redeliveries, the SMS sender's failed calls, the outage gate's probes and
// the in-process retries of serialization failures all take their delay
// from a Policy. It imports the standard library only.
//
// After the n-th failure (n >= 1) the delay is
//
//	d(n) = min(Max, Base·2^(n-1)), drawn uniformly from [d·(1-Jitter), d·(1+Jitter)]
//
// With the defaults (BaseDefault 1s, MaxDefault 5m, JitterDefault 0.25)
// the schedule is:
//
//	attempt   d       jittered range
//	1         1s      [750ms, 1.25s]
//	2         2s      [1.5s, 2.5s]
//	3         4s      [3s, 5s]
//	4         8s      [6s, 10s]
//	5         16s     [12s, 20s]
//	6         32s     [24s, 40s]
//	7         1m4s    [48s, 1m20s]
//	8         2m8s    [1m36s, 2m40s]
//	9         4m16s   [3m12s, 5m20s]
//	10+       5m      [3m45s, 6m15s]
//
// The jitter spreads the retries of rows or messages that failed together
// (one outage fails a whole batch) so that they do not come back together.
package retry

import (
	"fmt"
	"math"
	"math/rand/v2"
	"time"
)

// The defaults WithDefaults fills in.
const (
	// BaseDefault is the delay after the first failure.
	BaseDefault = time.Second
	// MaxDefault caps the un-jittered delay.
	MaxDefault = 5 * time.Minute
	// JitterDefault is the fraction by which a delay is spread either way.
	JitterDefault = 0.25
)

// maxShift caps the exponent of the SQL schedule: 2^60 seconds is far past
// any Max, and interval arithmetic overflows long before a larger shift.
const maxShift = 60

// Policy is an exponential back-off schedule. The zero value retries at
// once; use WithDefaults, or set the fields, for a real schedule.
type Policy struct {
	// Base is the delay after the first failure.
	Base time.Duration
	// Max caps the un-jittered delay; a jittered delay may exceed it by
	// Max·Jitter.
	Max time.Duration
	// Jitter in [0, 1] spreads each delay uniformly by ±Jitter of itself;
	// 0 makes the schedule exact.
	Jitter float64
}

// WithDefaults returns p with each zero field set to its default
// (BaseDefault, MaxDefault, JitterDefault).
func (p Policy) WithDefaults() Policy {
	if p.Base <= 0 {
		p.Base = BaseDefault
	}
	if p.Max <= 0 {
		p.Max = MaxDefault
	}
	if p.Jitter == 0 {
		p.Jitter = JitterDefault
	}
	return p
}

// Exact is the un-jittered delay after the attempt-th failure:
// min(Max, Base·2^(attempt-1)), for any attempt and any Max up to the
// longest Duration (the doubling stops at Max, so it never overflows). An
// attempt below 1 counts as 1; a Base or Max of 0 or less gives 0.
func (p Policy) Exact(attempt int) time.Duration {
	if p.Base <= 0 || p.Max <= 0 {
		return 0
	}
	d := min(p.Base, p.Max)
	for i := 1; i < attempt && d < p.Max; i++ {
		if d > p.Max/2 {
			d = p.Max // doubling would pass Max, or overflow
			break
		}
		d *= 2
	}
	return d
}

// Delay is the delay after the attempt-th failure: Exact(attempt) spread
// uniformly by ±Jitter. It is never negative, and at most
// Exact(attempt)·(1+Jitter) or the longest Duration, whichever is less. A
// Jitter that is not a number counts as 0.
func (p Policy) Delay(attempt int) time.Duration {
	d := p.Exact(attempt)
	if !(p.Jitter > 0) { // 0, negative or NaN: exact
		return d
	}
	j := min(p.Jitter, 1)
	f := float64(d) * (1 - j + 2*j*rand.Float64())
	if f >= math.MaxInt64 { // float64(MaxInt64) is 2^63: past every Duration
		return math.MaxInt64
	}
	return time.Duration(f)
}

// SQL is the same schedule as a PostgreSQL float8 expression in seconds,
// for code that sets next_attempt_at in the UPDATE that records the
// failure. attempt, base, max and jitter are SQL expressions (columns or
// parameters; base and max in seconds). The exponent is capped because
// interval arithmetic overflows ("interval out of range") once
// Base·2^(n-1) passes ~292,000 years, which with a 1s base is attempt 45.
func SQL(attempt, base, max, jitter string) string {
	return fmt.Sprintf(`(least(%[2]s::float8, %[3]s::float8 * power(2::float8, least(greatest((%[1]s) - 1, 0), %[5]d)))
	* (1 - %[4]s::float8 + 2 * %[4]s::float8 * random()))`, attempt, max, base, jitter, maxShift)
}

// BackOff is a stateful walk along p's schedule with the method set of
// github.com/cenkalti/backoff's BackOff (NextBackOff, Reset), so a Policy
// can drive that package's retry loop.
func (p Policy) BackOff() *Walk { return &Walk{p: p} }

// Walk is p's schedule one failure at a time. Not safe for concurrent use.
type Walk struct {
	p Policy
	n int
}

// NextBackOff is the delay after the next failure.
func (w *Walk) NextBackOff() time.Duration {
	w.n++
	return w.p.Delay(w.n)
}

// Reset starts the schedule again from the first failure.
func (w *Walk) Reset() { w.n = 0 }
