//go:build e2e

package failpoint

import (
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
)

// The environment form must SIGKILL the process: run this test binary again
// as a child with FAILPOINTS set and check how it died.
func TestEnvironmentKillsTheProcess(t *testing.T) {
	if os.Getenv("FAILPOINT_CHILD") == "1" {
		Hit("x")
		Hit("boom") // armed @2: this one kills
		os.Exit(0)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestEnvironmentKillsTheProcess$")
	cmd.Env = append(os.Environ(), "FAILPOINT_CHILD=1", "FAILPOINTS=other, boom@1")
	out, err := cmd.CombinedOutput()
	ee, ok := err.(*exec.ExitError)
	if !ok {
		t.Fatalf("child did not die: %v\n%s", err, out)
	}
	ws := ee.Sys().(syscall.WaitStatus)
	if !ws.Signaled() || ws.Signal() != syscall.SIGKILL || !strings.Contains(string(out), "failpoint boom") {
		t.Fatalf("child exit %v, want SIGKILL at failpoint boom\n%s", ws, out)
	}
}
