//go:build e2e

package failpoint

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
)

// The environment form must SIGKILL the process: run this test binary again
// as a child with FAILPOINTS set and check how it died.
func TestEnvironmentKillsTheProcess(t *testing.T) {
	switch os.Getenv("FAILPOINT_CHILD") {
	case "plain":
		Hit("x")
		Hit("boom") // armed @2: the first hit passes
		fmt.Println("survived the hits before")
		Hit("boom") // this one kills
		os.Exit(0)
	case "aimed":
		Hit("boom")           // aimed at u_1: ignored
		HitFor("boom", "u_2") // another subject: ignored
		fmt.Println("survived the hits before")
		HitFor("boom", "u_1") // kills
		os.Exit(0)
	}
	for mode, env := range map[string]string{"plain": "other, boom@2", "aimed": "other,boom=u_1"} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestEnvironmentKillsTheProcess$")
		cmd.Env = append(os.Environ(), "FAILPOINT_CHILD="+mode, "FAILPOINTS="+env)
		out, err := cmd.CombinedOutput()
		ee, ok := err.(*exec.ExitError)
		if !ok {
			t.Fatalf("%s: child did not die: %v\n%s", mode, err, out)
		}
		ws := ee.Sys().(syscall.WaitStatus)
		if !ws.Signaled() || ws.Signal() != syscall.SIGKILL || !strings.Contains(string(out), "failpoint boom") ||
			!strings.Contains(string(out), "survived the hits before") {
			t.Fatalf("%s: child exit %v, want SIGKILL at the last failpoint boom\n%s", mode, ws, out)
		}
	}
}
