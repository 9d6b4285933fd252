package cashback

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
)

// Test hook environment variables. Both are inert unless set; they exist
// so the e2e suite can make the handler fail on purpose.
const (
	// EnvFailEventIDs is a comma-separated list of event ids whose handling
	// fails, every time ("id") or on the first N attempts ("id@N"). Use it
	// for "handler made to fail past maxReceiveCount" (the message ends in
	// payments-events-dlq) and, with @N, for a failure followed by a retry.
	EnvFailEventIDs = "REWARDS_FAIL_EVENT_IDS"
	// EnvFailFirstN makes the first N handling attempts of this process
	// fail, whatever the event. Use it for "the rate changes between a
	// failed attempt and the retry": the retry must still credit at the
	// rate in force at occurred_at.
	EnvFailFirstN = "REWARDS_FAIL_FIRST_N"
	// EnvSlowEventIDs is a comma-separated list of "id@duration": handling
	// of those events holds its transaction open that long (after the
	// dedupe row and the effect's writes, before COMMIT), every attempt.
	// Use it for "a handler outlives its visibility timeout": a second
	// replica receives the copy meanwhile and waits on the dedupe key.
	EnvSlowEventIDs = "REWARDS_SLOW_EVENT_IDS"
)

// ErrInjected is the error an armed FailHook returns. It is transient: the
// transaction rolls back (nothing committed, dedupe row included) and SQS
// redelivers the message after its backoff.
var ErrInjected = errors.New("rewards: injected failure (test hook " + EnvFailEventIDs + "/" + EnvFailFirstN + ")")

// FailHook injects handler failures for tests. The zero value and nil are
// inert. It fails after the effect has written everything, just before
// COMMIT, so an injected failure also shows that nothing of a failed
// attempt survives. Each injected failure increments the counter
// rewards_injected_failures_total (visible on /metrics), so a test can wait
// for "the first attempt has failed" before changing something.
type FailHook struct {
	firstN atomic.Int64 // attempts still to fail, any event

	mu       sync.Mutex
	byID     map[uuid.UUID]int64 // remaining failures per event id; -1 = always
	slow     map[uuid.UUID]time.Duration
	injected atomic.Int64
	count    metric.Int64Counter
}

// Injected is how many failures the hook has injected so far.
func (h *FailHook) Injected() int64 {
	if h == nil {
		return 0
	}
	return h.injected.Load()
}

// ParseFailHook builds a hook from the two variables' values (os.Getenv of
// EnvFailEventIDs and EnvFailFirstN). Both empty gives an inert hook.
func ParseFailHook(eventIDs, firstN string) (*FailHook, error) {
	h := &FailHook{byID: map[uuid.UUID]int64{}}
	if s := strings.TrimSpace(firstN); s != "" {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n < 0 {
			return nil, fmt.Errorf("%s=%q: want a non-negative integer", EnvFailFirstN, firstN)
		}
		h.firstN.Store(n)
	}
	for _, item := range strings.Split(eventIDs, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		idText, nText, limited := strings.Cut(item, "@")
		id, err := uuid.Parse(idText)
		if err != nil {
			return nil, fmt.Errorf("%s: %q is not an event id", EnvFailEventIDs, idText)
		}
		n := int64(-1)
		if limited {
			if n, err = strconv.ParseInt(nText, 10, 64); err != nil || n < 1 {
				return nil, fmt.Errorf("%s: %q: want id or id@N with N >= 1", EnvFailEventIDs, item)
			}
		}
		h.byID[id] = n
	}
	var err error
	h.count, err = otel.Meter(otelScope).Int64Counter(
		"rewards_injected_failures_total", metric.WithDescription("Handler failures injected by the test hook ("+EnvFailEventIDs+", "+EnvFailFirstN+")."))
	return h, err
}

// SetSlow arms EnvSlowEventIDs: spec is its value, "id@duration,...".
func (h *FailHook) SetSlow(spec string) error {
	slow := map[uuid.UUID]time.Duration{}
	for _, item := range strings.Split(spec, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		idText, dText, _ := strings.Cut(item, "@")
		id, err := uuid.Parse(idText)
		if err != nil {
			return fmt.Errorf("%s: %q is not an event id", EnvSlowEventIDs, idText)
		}
		d, err := time.ParseDuration(dText)
		if err != nil || d <= 0 {
			return fmt.Errorf("%s: %q: want id@duration, e.g. id@10s", EnvSlowEventIDs, item)
		}
		slow[id] = d
	}
	h.mu.Lock()
	h.slow = slow
	h.mu.Unlock()
	return nil
}

// Armed reports whether the hook can ever fail or slow anything.
func (h *FailHook) Armed() bool {
	if h == nil {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.firstN.Load() > 0 || len(h.byID) > 0 || len(h.slow) > 0
}

// Check first holds for the EnvSlowEventIDs delay of eventID, if any, then
// returns ErrInjected if this attempt for eventID is to fail.
func (h *FailHook) Check(eventID uuid.UUID) error {
	if h == nil {
		return nil
	}
	fail := false
	h.mu.Lock()
	delay := h.slow[eventID]
	h.mu.Unlock()
	if delay > 0 {
		slog.Warn("test hook: holding the transaction open", "event_id", eventID, "for", delay, "hook", EnvSlowEventIDs)
		time.Sleep(delay)
	}
	h.mu.Lock()
	if n, ok := h.byID[eventID]; ok {
		fail = true
		if n > 0 {
			if n == 1 {
				delete(h.byID, eventID)
			} else {
				h.byID[eventID] = n - 1
			}
		}
	}
	h.mu.Unlock()
	if !fail {
		for {
			n := h.firstN.Load()
			if n <= 0 {
				break
			}
			if h.firstN.CompareAndSwap(n, n-1) {
				fail = true
				break
			}
		}
	}
	if !fail {
		return nil
	}
	h.injected.Add(1)
	if h.count != nil {
		h.count.Add(context.Background(), 1)
	}
	return fmt.Errorf("%w: event %s", ErrInjected, eventID)
}
