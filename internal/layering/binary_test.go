package layering

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// What only a test build may hold: the code that SIGKILLs its own process
// at a FAILPOINTS step, the reader of FAILPOINTS, and rewards' failure hook.
var testOnly = []struct {
	what   string
	symbol string // in `go tool nm`; empty: none
	text   string // in the binary's bytes; empty: none
}{
	{what: "the failpoint kill", text: "failpoint %s: SIGKILL"},
	{what: "the FAILPOINTS reader", symbol: "/pkg/failpoint.init.0"},
	{what: "rewards' failure hook", symbol: "/services/rewards/cashback.ParseFailHook"},
}

func build(t *testing.T, dir string, tags string, pkgs ...string) {
	t.Helper()
	args := []string{"build", "-o", dir + string(filepath.Separator)}
	if tags != "" {
		args = append(args, "-tags", tags)
	}
	cmd := exec.Command("go", append(args, pkgs...)...)
	cmd.Dir = repoRoot
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// holds lists which test-only pieces the binary at path contains.
func holds(t *testing.T, path string) map[string]bool {
	t.Helper()
	nm, err := exec.Command("go", "tool", "nm", path).Output()
	if err != nil {
		t.Fatalf("go tool nm %s: %v", path, err)
	}
	bin, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, p := range testOnly {
		if (p.symbol != "" && bytes.Contains(nm, []byte(p.symbol+"\n"))) || (p.text != "" && bytes.Contains(bin, []byte(p.text))) {
			out[p.what] = true
		}
	}
	return out
}

// A production build of each service holds no path that kills its own
// process and no failure hook; the e2e build of rewards holds all of them
// (so the check sees what it looks for).
func TestProductionBinariesHoldNoCrashPointOrFailureHook(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the services")
	}
	dir := t.TempDir()
	build(t, dir, "", "./services/payments", "./services/rewards", "./services/notifications")
	for _, name := range []string{"payments", "rewards", "notifications"} {
		for what := range holds(t, filepath.Join(dir, name)) {
			t.Errorf("the production build of %s holds %s", name, what)
		}
	}
	e2e := filepath.Join(dir, "e2e")
	build(t, e2e, "e2e", "./services/rewards")
	got := holds(t, filepath.Join(e2e, "rewards"))
	for _, p := range testOnly {
		if !got[p.what] {
			t.Errorf("the e2e build of rewards lacks %s: the check above cannot see it", p.what)
		}
	}
}
