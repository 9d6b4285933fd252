// Package failpoint lets tests crash a process at a named step, to prove
// that every crash point between two steps loses nothing and applies
// nothing twice.
//
// A failpoint is inert unless armed. In-process tests arm a step with
// Enable, and Hit then reports true so the caller can abandon its work as a
// crash would.
//
// Only in binaries built with the tag e2e (the end-to-end suite builds the
// services so), processes also arm steps with the environment variable
// FAILPOINTS, a comma-separated list of step names: when the code reaches
// such a step, the process kills itself with SIGKILL (no deferred functions,
// no graceful shutdown: the closest thing to pulling the plug).
// FAILPOINTS=name@N arms it from the N-th hit on. FAILPOINTS=name=subject
// (or name@N=subject) aims it: only hits reported by HitFor with that
// subject count and fire, so a scenario can crash the process on its own
// message and not on whichever another left in flight. A binary built
// without the tag reads no FAILPOINTS and holds no code that kills its
// process.
package failpoint

import (
	"sync"
	"sync/atomic"
)

// Step names of the library's own crash points. A service names its own
// steps next to the code that hits them.
const (
	AfterPublishBeforeMark  = "after-publish-before-mark"  // outbox relay: sent to SQS, not yet marked published
	AfterCommitBeforeDelete = "after-commit-before-delete" // consumer: effect committed, SQS message not yet deleted
)

type point struct {
	from    int64  // first hit that fires (1-based)
	subject string // when set, only hits for this subject count
	hits    atomic.Int64
	proc    bool // armed by the environment: kill the process
}

var (
	mu     sync.RWMutex
	points = map[string]*point{}
)

// Enable arms name in this process until the returned function is called.
// Hit(name) then returns true from the from-th hit on (from < 1 means 1).
func Enable(name string, from int64) (disable func()) {
	return EnableFor(name, "", from)
}

// EnableFor arms name for one subject: only HitFor(name, subject) counts
// and fires, from its from-th hit on. An empty subject means any.
func EnableFor(name, subject string, from int64) (disable func()) {
	if from < 1 {
		from = 1
	}
	mu.Lock()
	points[name] = &point{from: from, subject: subject}
	mu.Unlock()
	return func() {
		mu.Lock()
		delete(points, name)
		mu.Unlock()
	}
}

// Hit marks that the code reached step name. Unarmed, it does nothing and
// returns false. Armed by FAILPOINTS (e2e builds), it kills the process. Armed by Enable,
// it returns true: the caller must then stop as if it had crashed (no
// cleanup that a crash would not do). A point aimed at a subject ignores Hit.
func Hit(name string) bool { return HitFor(name, "") }

// HitFor is Hit for one subject (a recipient, a user): a point aimed at
// another subject neither fires nor counts the hit.
func HitFor(name, subject string) bool {
	mu.RLock()
	p := points[name]
	mu.RUnlock()
	if p == nil || p.subject != "" && p.subject != subject || p.hits.Add(1) < p.from {
		return false
	}
	if p.proc {
		killProcess(name) // only e2e builds arm proc points
	}
	return true
}
