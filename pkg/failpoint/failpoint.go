// Package failpoint lets tests crash a process at a named step, to prove
// that every crash point between two steps loses nothing and applies
// nothing twice.
//
// A failpoint is inert unless armed. Processes arm it with the environment
// variable FAILPOINTS, a comma-separated list of step names: when the code
// reaches an armed step, the process kills itself with SIGKILL (no deferred
// functions, no graceful shutdown: the closest thing to pulling the plug).
// FAILPOINTS=name@N arms it from the N-th hit on. In-process tests arm a step
// with Enable instead, and Hit then reports true so the caller can abandon
// its work as a crash would.
package failpoint

import (
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
)

// Step names of the library's own crash points. A service names its own
// steps next to the code that hits them.
const (
	AfterPublishBeforeMark  = "after-publish-before-mark"  // outbox relay: sent to SQS, not yet marked published
	AfterCommitBeforeDelete = "after-commit-before-delete" // consumer: effect committed, SQS message not yet deleted
)

type point struct {
	from int64 // first hit that fires (1-based)
	hits atomic.Int64
	proc bool // armed by the environment: kill the process
}

var (
	mu     sync.RWMutex
	points = map[string]*point{}
)

func init() {
	for _, s := range strings.Split(os.Getenv("FAILPOINTS"), ",") {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		name, n, _ := strings.Cut(s, "@")
		from, err := strconv.ParseInt(n, 10, 64)
		if err != nil || from < 1 {
			from = 1
		}
		points[name] = &point{from: from, proc: true}
	}
}

// Enable arms name in this process until the returned function is called.
// Hit(name) then returns true from the from-th hit on (from < 1 means 1).
func Enable(name string, from int64) (disable func()) {
	if from < 1 {
		from = 1
	}
	mu.Lock()
	points[name] = &point{from: from}
	mu.Unlock()
	return func() {
		mu.Lock()
		delete(points, name)
		mu.Unlock()
	}
}

// Hit marks that the code reached step name. Unarmed, it does nothing and
// returns false. Armed by FAILPOINTS, it kills the process. Armed by Enable,
// it returns true: the caller must then stop as if it had crashed (no
// cleanup that a crash would not do).
func Hit(name string) bool {
	mu.RLock()
	p := points[name]
	mu.RUnlock()
	if p == nil || p.hits.Add(1) < p.from {
		return false
	}
	if p.proc {
		slog.Error("failpoint reached: killing the process", "failpoint", name)
		fmt.Fprintf(os.Stderr, "failpoint %s: SIGKILL\n", name)
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // the signal is on its way
	}
	return true
}
