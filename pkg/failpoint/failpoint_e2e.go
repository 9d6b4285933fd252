//go:build e2e

package failpoint

import (
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// Compiled is true in the build that arms failpoints from FAILPOINTS.
const Compiled = true

func init() {
	for _, s := range strings.Split(os.Getenv("FAILPOINTS"), ",") {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		spec, subject, _ := strings.Cut(s, "=")
		name, n, _ := strings.Cut(spec, "@")
		from, err := strconv.ParseInt(n, 10, 64)
		if err != nil || from < 1 {
			from = 1
		}
		points[name] = &point{from: from, subject: subject, proc: true}
	}
}

// killProcess pulls the plug: SIGKILL to this process, no deferred calls.
func killProcess(name string) {
	slog.Error("failpoint reached: killing the process", "failpoint", name)
	fmt.Fprintf(os.Stderr, "failpoint %s: SIGKILL\n", name)
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {} // the signal is on its way
}
