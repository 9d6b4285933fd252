// Package sqlcheck holds one test: every SQL statement the project sends
// to PostgreSQL is a constant, and input travels only as parameters ($1,
// $2, ...). It parses every non-test Go file of the module and fails on a
// query built from anything but string constants, unless the call is on
// the reviewed allowlist below, with its reason.
package sqlcheck

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// sqlMethods are the calls whose argument at the given index is SQL text.
var sqlMethods = map[string]int{
	"Exec": 1, "Query": 1, "QueryRow": 1, // pgx: (ctx, sql, args...)
	"Queue": 0, // pgx.Batch.Queue(sql, args...)
}

// allowed are the reviewed exceptions: "file:function" → why it is safe.
// Each concatenates only identifiers quoted by pgx.Identifier.Sanitize, or
// fragments chosen from constants in code; every value is a parameter.
var allowed = map[string]string{
	"pkg/idempotent/partitions.go:partitionDDL":      "its callers (createPartition, dropExpiredAt) pass DDL naming the partition via pgx.Identifier.Sanitize, with bounds the code formats from a date (DDL takes no parameters)",
	"pkg/idempotent/inbox_admin.go:InboxBacklog":     "appends the constant \"AND consumer = $1\" or nothing; the consumer is a parameter",
	"pkg/idempotent/inbox_admin.go:Replay":           "joins constant \"column = $n\" conditions chosen by which filters are set; values are parameters",
	"pkg/idempotent/processor.go:claimOn":            "claimSQL is a package variable assembled once from constants (named parameters)",
	"pkg/outbox/relay.go:finish":                     "rescheduleSQL is a package variable assembled once from constants (the retry schedule over o.attempts + 1)",
	"pkg/idempotent/processor.go:record":             "backoffSQL is a constant template filled with the constant column name i.attempts",
	"pkg/idempotent/processor.go:chargeOnly":         "chargeOnlySQL is a package variable assembled once from constants (backoffSQL over i.attempts; named parameters)",
	"services/notifications/sender/sender.go:fenced": "the SET clause is one of three constant strings at its call sites; values are $3, $4",
	"internal/testenv/testenv.go:DatabaseURL":        "test databases named t_<random hex> by the code (DDL takes no parameters)",
	"internal/testenv/hostile.go:TableDigest":        "test helper: table names are the caller's constants, via pgx.Identifier.Sanitize",
	"cmd/bench/pg.go:freshDB":                        "bench database names made by the code, via pgx.Identifier.Sanitize",
	"cmd/bench/pg.go:createDB":                       "bench database names made by the code, via pgx.Identifier.Sanitize",
	"cmd/bench/pg.go:drop":                           "bench database names made by the code, via pgx.Identifier.Sanitize",
	"cmd/bench/pipeline.go:collect":                  "a helper whose callers pass constant queries",
	"cmd/bench/sqs.go:count":                         "a helper whose callers pass constant queries",
	"cmd/benchstores/env.go:newEnv":                  "the bench database name made by the code, via pgx.Identifier.Sanitize",
	"bench/peers/db.go:freshDB":                      "peer database names made by the code, via pgx.Identifier.Sanitize",
}

func TestEveryQueryIsAConstantWithParameters(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	var findings []string
	used := map[string]bool{}
	calls := 0
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != root && (strings.HasPrefix(name, ".") || name == "bin" || name == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		rel, _ := filepath.Rel(root, path)
		fs, n, err := check(path, rel)
		if err != nil {
			return err
		}
		calls += n
		for _, f := range fs {
			if _, ok := allowed[f.key]; ok {
				used[f.key] = true
				continue
			}
			findings = append(findings, f.msg)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if calls < 50 {
		t.Fatalf("found only %d SQL calls: the scan is broken", calls)
	}
	sort.Strings(findings)
	for _, f := range findings {
		t.Error(f)
	}
	for k := range allowed {
		if !used[k] {
			t.Errorf("allowlist entry %s matches nothing: remove it", k)
		}
	}
	t.Logf("%d SQL calls checked", calls)
}

type finding struct{ key, msg string }

// check parses one file and returns its non-constant SQL arguments and
// how many SQL calls it has.
func check(path, rel string) ([]finding, int, error) {
	src, err := os.ReadFile(path)
	if err != nil {
		return nil, 0, err
	}
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, path, src, parser.SkipObjectResolution)
	if err != nil {
		return nil, 0, err
	}
	consts := packageConsts(filepath.Dir(path))
	var out []finding
	n := 0
	var fn string
	ast.Inspect(f, func(node ast.Node) bool {
		if d, ok := node.(*ast.FuncDecl); ok {
			fn = d.Name.Name
		}
		if d, ok := node.(*ast.GenDecl); ok && d.Tok == token.CONST {
			for _, spec := range d.Specs {
				for _, name := range spec.(*ast.ValueSpec).Names {
					consts[name.Name] = true // function-local constants too
				}
			}
		}
		call, ok := node.(*ast.CallExpr)
		if !ok {
			return true
		}
		sel, ok := call.Fun.(*ast.SelectorExpr)
		if !ok {
			return true
		}
		i, ok := sqlMethods[sel.Sel.Name]
		if !ok || len(call.Args) <= i || !looksLikeSQLCall(call, i) {
			return true
		}
		n++
		if !constant(call.Args[i], consts) {
			key := rel + ":" + fn
			out = append(out, finding{key, fmt.Sprintf("%s: %s builds its SQL from %s: use a constant and $n parameters (or add %q to the allowlist with a reason)",
				fset.Position(call.Pos()), sel.Sel.Name, exprString(src, fset, call.Args[i]), key)})
		}
		return true
	})
	return out, n, nil
}

// looksLikeSQLCall skips same-named calls that are not database calls
// (for example an SQS client's methods take a context and a struct).
func looksLikeSQLCall(call *ast.CallExpr, i int) bool {
	switch a := call.Args[i].(type) {
	case *ast.UnaryExpr, *ast.CompositeLit:
		return false
	case *ast.BasicLit:
		return a.Kind == token.STRING
	}
	return true
}

// constant reports whether e is built only from string literals and
// constants of its package.
func constant(e ast.Expr, consts map[string]bool) bool {
	switch e := e.(type) {
	case *ast.BasicLit:
		return e.Kind == token.STRING
	case *ast.Ident:
		return consts[e.Name]
	case *ast.ParenExpr:
		return constant(e.X, consts)
	case *ast.BinaryExpr:
		return e.Op == token.ADD && constant(e.X, consts) && constant(e.Y, consts)
	}
	return false
}

var constCache = map[string]map[string]bool{}

// packageConsts are the package-level constant names of the package in dir.
func packageConsts(dir string) map[string]bool {
	if c, ok := constCache[dir]; ok {
		return clone(c)
	}
	c := map[string]bool{}
	files, _ := filepath.Glob(filepath.Join(dir, "*.go"))
	for _, path := range files {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.SkipObjectResolution)
		if err != nil {
			continue
		}
		for _, d := range f.Decls {
			if g, ok := d.(*ast.GenDecl); ok && g.Tok == token.CONST {
				for _, spec := range g.Specs {
					for _, name := range spec.(*ast.ValueSpec).Names {
						c[name.Name] = true
					}
				}
			}
		}
	}
	constCache[dir] = c
	return clone(c)
}

func clone(m map[string]bool) map[string]bool {
	out := make(map[string]bool, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

func exprString(src []byte, fset *token.FileSet, e ast.Expr) string {
	s := string(src[fset.Position(e.Pos()).Offset:fset.Position(e.End()).Offset])
	if len(s) > 80 {
		s = s[:77] + "..."
	}
	return s
}

func TestTheCheckFlagsQueriesBuiltFromInput(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "q.go")
	src := `package q

const table = "wallets"

func f(db DB, b *Batch, userID string) {
	db.Exec(ctx, "DELETE FROM wallets WHERE user_id = '"+userID+"'")
	db.Query(ctx, fmt.Sprintf("SELECT * FROM %s", userID))
	db.QueryRow(ctx, "SELECT balance FROM "+table+" WHERE user_id = $1", userID)
	b.Queue("UPDATE wallets SET balance = " + userID)
	const local = "SELECT 1"
	db.Exec(ctx, local)
	sqs.SendMessage(ctx, &Input{})
}
`
	if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	fs, n, err := check(path, "q.go")
	if err != nil {
		t.Fatal(err)
	}
	if n != 5 || len(fs) != 3 {
		t.Fatalf("%d SQL calls, %d findings %v; want 5 calls and the 3 built from userID", n, len(fs), fs)
	}
	for i, want := range []string{"Exec", "Query", "Queue"} {
		if !strings.Contains(fs[i].msg, want+" builds its SQL") {
			t.Errorf("finding %d: %s, want %s", i, fs[i].msg, want)
		}
	}
}
