package service

import (
	"context"
	"log/slog"
	"net/http"
	"sync"
	"time"
)

// ReadinessTTL is how long one evaluation of the /readyz checks answers
// every probe. /readyz is open to anyone who can reach it and each check
// costs a call (a database ping, an SQS GetQueueAttributes, which AWS
// bills): cached, a flood of probes costs the checks at most once per TTL,
// and an orchestrator polling every few seconds still sees each change
// within a second.
const ReadinessTTL = time.Second

// readinessTimeout bounds one evaluation of all the checks.
const readinessTimeout = 2 * time.Second

// readiness runs the checks for /readyz at most once per ReadinessTTL.
// Probes arriving while an evaluation runs wait for it and share its
// answer. The evaluation runs on a context of its own, so a probe whose
// client goes away does not leave a "failing" cached for the others.
type readiness struct {
	checks map[string]Check
	log    *slog.Logger

	mu     sync.Mutex // held for an evaluation: waiting probes queue on it
	at     time.Time  // when the cached answer was made; zero: none yet
	status map[string]string
	code   int
}

func (r *readiness) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	status, code := r.answer(req.Context())
	WriteJSON(w, code, status)
}

func (r *readiness) answer(reqCtx context.Context) (map[string]string, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.at.IsZero() && time.Since(r.at) < ReadinessTTL {
		return r.status, r.code
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(reqCtx), readinessTimeout)
	defer cancel()
	status, code := make(map[string]string, len(r.checks)), http.StatusOK
	for name, check := range r.checks {
		if err := check(ctx); err != nil {
			// The detail (a host, a driver's message) is for the log:
			// the endpoint is open to anyone who can reach it.
			r.log.WarnContext(ctx, "readiness check failing", "check", name, "error", err)
			status[name], code = "failing", http.StatusServiceUnavailable
		} else {
			status[name] = "ok"
		}
	}
	r.status, r.code, r.at = status, code, time.Now()
	return status, code
}
