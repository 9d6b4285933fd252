package layering

import (
	"os/exec"
	"strings"
	"testing"
)

// module is this repository's module path (a copy made with gonew has
// another one).
var module = func() string {
	out, err := exec.Command("go", "list", "-m").Output()
	if err != nil {
		panic("go list -m: " + err.Error())
	}
	return strings.TrimSpace(string(out))
}()

// The layers of pkg/ (docs/design.md, "Layers of the library"): for each
// package, import-path prefixes that must not be among its transitive
// dependencies (test files excluded: these are what a copy of the package
// compiles).
var forbidden = map[string][]string{
	// The leaf every layer shares: the standard library only.
	"pkg/errs":  {"github.com/", "golang.org/", "go.opentelemetry.io/"},
	"pkg/retry": {"github.com/", "golang.org/", "go.opentelemetry.io/"},
	// Process plumbing: no transport, no outbox.
	"pkg/service": {"github.com/aws/", module + "/pkg/sqstransport", module + "/pkg/outbox", module + "/pkg/idempotent", module + "/services/"},
	// PostgreSQL-only packages build without the AWS SDK.
	"pkg/httpidem":   {"github.com/aws/", module + "/pkg/service", module + "/pkg/sqstransport", module + "/services/"},
	"pkg/outbox":     {"github.com/aws/", module + "/pkg/service", module + "/pkg/sqstransport", module + "/services/"},
	"pkg/idempotent": {"github.com/aws/", module + "/pkg/service", module + "/pkg/sqstransport", module + "/services/"},
	// Strict request bodies: the envelope's duplicate-field scan and the
	// error body, nothing of the service shell, no database.
	"pkg/httpjson": {"github.com/aws/", "github.com/jackc/", "go.opentelemetry.io/", module + "/pkg/service", module + "/pkg/outbox", module + "/pkg/idempotent", module + "/pkg/sqstransport", module + "/pkg/httpidem", module + "/services/"},
	"pkg/events":   {"github.com/aws/", "github.com/jackc/", module + "/pkg/", module + "/services/"},
	"pkg/migrate":  {"github.com/aws/", module + "/pkg/", module + "/services/"},
	// The transport knows the envelope and the outbox's Publisher, not the
	// consumers built on it, nor the service shell.
	"pkg/sqstransport":        {module + "/pkg/service", module + "/pkg/idempotent", module + "/pkg/httpidem", module + "/services/"},
	"pkg/idempotent/inboxsqs": {module + "/pkg/service", module + "/services/"},
	"pkg/failpoint":           {"github.com/", module + "/services/"},
	// The loop of every background worker: no database, no transport.
	"pkg/worker": {"github.com/aws/", "github.com/jackc/", module + "/pkg/", module + "/services/"},
	"pkg/outage": {"github.com/aws/", module + "/pkg/service", module + "/pkg/sqstransport", module + "/services/"},
	// Shared internals of pkg/: the standard library only.
	"pkg/internal/snapshot": {"github.com/", "golang.org/", "go.opentelemetry.io/", module + "/services/"},
	"pkg/internal/settings": {"github.com/", "golang.org/", "go.opentelemetry.io/", module + "/"},
	// The uuid parameters of pkg/'s statements: uuid and pgx, nothing else.
	"pkg/internal/pgid": {"github.com/aws/", "go.opentelemetry.io/", module + "/"},
	// Other stores for the dedupe key: each brings only its own client.
	"pkg/idempotent/idemdynamo": {"github.com/aws/aws-sdk-go-v2/service/sqs", "github.com/redis/", module + "/pkg/service", module + "/pkg/sqstransport", module + "/services/"},
	"pkg/idempotent/prefilter":  {"github.com/aws/", module + "/pkg/service", module + "/pkg/sqstransport", module + "/services/"},
}

// deps lists the transitive non-test dependencies of pkg, by import path.
func deps(t *testing.T, pkg string, tags ...string) []string {
	t.Helper()
	args := []string{"list", "-deps"}
	if len(tags) > 0 {
		args = append(args, "-tags", strings.Join(tags, ","))
	}
	out, err := exec.Command("go", append(args, pkg)...).Output()
	if err != nil {
		t.Fatalf("go list -deps %s: %v", pkg, err)
	}
	return strings.Fields(string(out))
}

// No package of pkg/ depends, directly or through another, on a package its
// layer forbids; every package of pkg/ has its layer stated here.
func TestEveryLibraryPackageImportsOnlyWhatItsLayerAllows(t *testing.T) {
	out, err := exec.Command("go", "list", "../../pkg/...").Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range strings.Fields(string(out)) {
		rel := strings.TrimPrefix(p, module+"/")
		bans, ok := forbidden[rel]
		if !ok {
			t.Errorf("%s has no layer in internal/layering: add it to forbidden", rel)
			continue
		}
		for _, d := range deps(t, "../../"+rel) {
			if d == p {
				continue
			}
			for _, ban := range bans {
				if strings.HasPrefix(d, ban) {
					t.Errorf("%s depends on %s (its layer forbids %s)", rel, d, ban)
				}
			}
		}
	}
}

// The library names no event type of this system: those live in
// services/contract, so a copy of pkg/ carries no payments vocabulary.
func TestTheLibraryNamesNoEventTypeOfThisSystem(t *testing.T) {
	names := []string{"PaymentSucceeded", "PaymentRefunded", "CashbackCredited", "CashbackReversed"}
	for path, text := range sourceFiles(t) {
		if !strings.HasPrefix(path, "pkg/") || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			continue
		}
		for _, n := range names {
			if strings.Contains(text, `"`+n+`"`) {
				t.Errorf("%s names the event type %q: move it to services/contract", path, n)
			}
		}
	}
}
