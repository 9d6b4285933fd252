//go:build !e2e

package failpoint

import (
	"os"
	"os/exec"
	"testing"
)

// A production build ignores FAILPOINTS: a step named there is reached and
// the process carries on (it holds no code that could kill it).
func TestAProductionBuildIgnoresFailpointsInTheEnvironment(t *testing.T) {
	if os.Getenv("FAILPOINT_CHILD") == "1" {
		if Hit("boom") {
			os.Exit(3)
		}
		os.Exit(0)
	}
	if Compiled {
		t.Fatal("Compiled is true without the e2e tag")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestAProductionBuildIgnoresFailpointsInTheEnvironment$")
	cmd.Env = append(os.Environ(), "FAILPOINT_CHILD=1", "FAILPOINTS=boom")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("child with FAILPOINTS=boom: %v\n%s", err, out)
	}
}

// The e2e build's environment form, which make test does not compile by
// default: run this package's tests again with the tag.
func TestTheE2EBuildKillsAtAnArmedStep(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the package again with -tags e2e")
	}
	out, err := exec.Command("go", "test", "-count=1", "-tags", "e2e", "-run", "^TestEnvironmentKillsTheProcess$", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go test -tags e2e: %v\n%s", err, out)
	}
}
