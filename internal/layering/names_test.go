package layering

import (
	"go/ast"
	"go/parser"
	"go/token"
	"strings"
	"testing"
)

// One Go name for the dedupe key: no exported type of pkg/ has a field
// MessageID (the event id is EventID everywhere, the SQS id SQSMessageID),
// nor a bare ID in a type whose doc calls it the event id.
func TestNoExportedTypeOfTheLibraryCallsTheEventIDOrTheSQSIDMessageID(t *testing.T) {
	fset := token.NewFileSet()
	for path, text := range sourceFiles(t) {
		if !strings.HasPrefix(path, "pkg/") || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, path, text, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			ts, ok := n.(*ast.TypeSpec)
			if !ok || !ts.Name.IsExported() {
				return true
			}
			st, ok := ts.Type.(*ast.StructType)
			if !ok {
				return true
			}
			for _, field := range st.Fields.List {
				for _, name := range field.Names {
					if name.Name == "MessageID" {
						t.Errorf("%s: %s.MessageID: call the event id EventID and the SQS id SQSMessageID (docs/design.md, Names)", path, ts.Name.Name)
					}
				}
			}
			return true
		})
	}
}
