// Package settings checks configuration values against their ranges and
// gathers every failure, each naming its variable, so a service refuses to
// start with all of them in one message, before it connects to anything.
// pkg/service exports it as Limits; the libraries' environment tunings
// (outbox.RelayEnv, sqstransport.SubscriberEnv) check theirs with it.
package settings

import (
	"errors"
	"fmt"
	"net/url"
	"time"
)

// Errors gathers the failed checks. Prefix is put before every name (the
// envPrefix a service embeds a library's tuning with, such as "RELAY_").
type Errors struct {
	Prefix string
	errs   []error
}

// Int wants lo <= v <= hi.
func (e *Errors) Int(name string, v, lo, hi int) {
	if v < lo || v > hi {
		e.fail(name, v, fmt.Sprintf("%d..%d", lo, hi))
	}
}

// AtLeast wants v >= lo.
func (e *Errors) AtLeast(name string, v, lo int) {
	if v < lo {
		e.fail(name, v, fmt.Sprintf("at least %d", lo))
	}
}

// Positive wants v > 0.
func (e *Errors) Positive(name string, v time.Duration) {
	if v <= 0 {
		e.fail(name, v, "a positive duration such as 30s")
	}
}

// Tuning is for a library's tuning, where zero is "unset, the default":
// v is 0 or within lo..hi (hi 0: no upper bound).
func (e *Errors) Tuning(name string, v, lo, hi time.Duration) { tuning(e, name, v, lo, hi) }

// TuningInt is Tuning for a count.
func (e *Errors) TuningInt(name string, v, lo, hi int) { tuning(e, name, v, lo, hi) }

func tuning[T int | time.Duration](e *Errors, name string, v, lo, hi T) {
	if v == 0 || (v >= lo && (hi == 0 || v <= hi)) {
		return
	}
	want := fmt.Sprintf("%v..%v", lo, hi)
	if hi == 0 {
		want = fmt.Sprintf("at least %v", lo)
	}
	e.fail(name, v, want+", or unset for the default")
}

// HTTPURL wants an absolute http or https URL; example shows one.
func (e *Errors) HTTPURL(name, v, example string) {
	if u, err := url.Parse(v); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		e.fail(name, fmt.Sprintf("%q", v), "an http(s) URL such as "+example)
	}
}

// NotAbove wants lo <= hi, two settings in that order (a retry base and
// its maximum); a negative one is left to its own check.
func (e *Errors) NotAbove(loName string, lo time.Duration, hiName string, hi time.Duration) {
	if lo >= 0 && hi >= 0 && lo > hi {
		e.errs = append(e.errs, fmt.Errorf("%s%s (%v) is above %s%s (%v)", e.Prefix, loName, lo, e.Prefix, hiName, hi))
	}
}

// Add records err, if any: a check of the caller's own.
func (e *Errors) Add(err error) {
	if err != nil {
		e.errs = append(e.errs, err)
	}
}

// Err is every recorded error, joined; nil when there is none.
func (e *Errors) Err() error { return errors.Join(e.errs...) }

func (e *Errors) fail(name string, v any, want string) {
	e.errs = append(e.errs, fmt.Errorf("%s%s=%v: want %s", e.Prefix, name, v, want))
}
