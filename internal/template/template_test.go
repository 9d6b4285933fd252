// Package template checks the path the README's "Use it as a template"
// section promises: the repository copied under a new module path with
// gonew builds and passes its unit tests.
package template

import (
	"archive/zip"
	"bytes"
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const (
	repoRoot = "../.."
	newPath  = "example.com/acme/ledger"
)

// unitPackages are the copy's tests that need no stack: what a copy must
// pass before anything is started.
var unitPackages = []string{"./pkg/errs", "./pkg/events", "./pkg/failpoint", "./services/contract", "./internal/layering"}

func run(t *testing.T, dir string, env []string, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir, cmd.Env = dir, append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s (in %s): %v\n%s", name, strings.Join(args, " "), dir, err, out)
	}
	return string(out)
}

// proxy writes a GOPROXY=file:// module proxy holding the work tree (the
// files git tracks, and the untracked ones it does not ignore, less nested
// modules) as module version version, the layout `go mod download` reads.
func proxy(t *testing.T, module, version string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "proxy")
	v := filepath.Join(dir, filepath.FromSlash(module), "@v")
	if err := os.MkdirAll(v, 0o755); err != nil {
		t.Fatal(err)
	}
	list := run(t, repoRoot, nil, "git", "ls-files", "-z", "--cached", "--others", "--exclude-standard")
	files := strings.Split(strings.TrimRight(list, "\x00"), "\x00")
	// A directory with a go.mod of its own (bench/peers) is another module:
	// a module's zip leaves it out, as the go command does.
	var nested []string
	for _, f := range files {
		if strings.HasSuffix(f, "/go.mod") {
			nested = append(nested, strings.TrimSuffix(f, "go.mod"))
		}
	}
	inNested := func(f string) bool {
		for _, dir := range nested {
			if strings.HasPrefix(f, dir) {
				return true
			}
		}
		return false
	}
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	for _, f := range files {
		if inNested(f) {
			continue
		}
		b, err := os.ReadFile(filepath.Join(repoRoot, f))
		if os.IsNotExist(err) {
			continue // deleted in the work tree, not yet in the index
		}
		if err != nil {
			t.Fatal(err)
		}
		w, err := zw.Create(module + "@" + version + "/" + f)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Write(b); err != nil {
			t.Fatal(err)
		}
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	gomod, err := os.ReadFile(filepath.Join(repoRoot, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	info, _ := json.Marshal(map[string]any{"Version": version, "Time": time.Now().UTC()})
	for name, b := range map[string][]byte{"list": []byte(version + "\n"), version + ".info": info,
		version + ".mod": gomod, version + ".zip": buf.Bytes()} {
		if err := os.WriteFile(filepath.Join(v, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// The template path of the README: gonew copies the module, from a module
// proxy built from this work tree, under a new module path; the copy has no
// import of the old path left, builds, and passes its unit tests.
func TestACopyMadeWithGonewUnderANewModulePathBuildsAndPassesItsUnitTests(t *testing.T) {
	if testing.Short() {
		t.Skip("copies and builds the whole module")
	}
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git is needed to list the work tree's files")
	}
	module := strings.TrimSpace(run(t, repoRoot, nil, "go", "list", "-m"))
	tmp := t.TempDir()
	gonew := filepath.Join(tmp, "gonew")
	run(t, repoRoot, nil, "go", "build", "-o", gonew, "golang.org/x/tools/cmd/gonew")

	version := fmt.Sprintf("v0.0.0-%s-000000000000", time.Now().UTC().Format("20060102150405"))
	cache := filepath.Join(tmp, "modcache") // our own: the copied version never lands in the shared cache
	t.Cleanup(func() {                      // the module cache is read-only: make it removable for TempDir
		_ = filepath.WalkDir(cache, func(p string, d os.DirEntry, err error) error {
			if err == nil {
				_ = os.Chmod(p, 0o755)
			}
			return nil
		})
	})
	dst := filepath.Join(tmp, "ledger")
	run(t, tmp, []string{"GOPROXY=file://" + filepath.ToSlash(proxy(t, module, version)), "GOMODCACHE=" + cache,
		"GOSUMDB=off", "GOFLAGS=-mod=mod"}, gonew, module+"@"+version, newPath, dst)

	if out := run(t, dst, nil, "go", "list", "-m"); strings.TrimSpace(out) != newPath {
		t.Fatalf("the copy's module is %q, want %s", out, newPath)
	}
	// Every import of the copy resolves inside the copy or to a dependency.
	deps := run(t, dst, nil, "go", "list", "-deps", "-test", "-f", "{{.ImportPath}}", "./...")
	for _, d := range strings.Fields(deps) {
		if d == module || strings.HasPrefix(d, module+"/") {
			t.Errorf("the copy still imports %s", d)
		}
	}
	// Nor does any of its strings: instrumentation scopes and the like
	// name the package they are in, whatever its module.
	for _, l := range oldPathLiterals(t, dst, module) {
		t.Errorf("the copy still names the old module path: %s", l)
	}
	// Every package compiles. go list -export compiles each one and fails
	// on the first error, as go build ./... does, without linking a dozen
	// binaries nobody runs here.
	run(t, dst, nil, "go", "list", "-export", "-f", "{{.ImportPath}}", "./...")
	out := run(t, dst, nil, "go", append([]string{"test", "-short", "-count=1"}, unitPackages...)...)
	if strings.Count(out, "ok  \t"+newPath+"/") != len(unitPackages) {
		t.Errorf("the copy's unit tests:\n%s", out)
	}
}

// oldPathLiterals lists the string literals of the Go files under dir,
// imports aside, that contain module: what gonew, which rewrites imports
// only, leaves naming the old path.
func oldPathLiterals(t *testing.T, dir, module string) []string {
	t.Helper()
	var found []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".go") {
			return err
		}
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, p, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		imports := map[*ast.BasicLit]bool{}
		for _, im := range f.Imports {
			imports[im.Path] = true
		}
		ast.Inspect(f, func(n ast.Node) bool {
			if l, ok := n.(*ast.BasicLit); ok && l.Kind == token.STRING && !imports[l] && strings.Contains(l.Value, module) {
				rel, _ := filepath.Rel(dir, fset.Position(l.Pos()).Filename)
				found = append(found, fmt.Sprintf("%s:%d %s", rel, fset.Position(l.Pos()).Line, l.Value))
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return found
}
