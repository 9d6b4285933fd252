package layering

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// repoRoot is the module root: this package sits two levels below it.
const repoRoot = "../.."

// sourceFiles yields the tracked kinds of text a reader of the repository
// follows references in: Go, Markdown, Makefiles, scripts, compose files.
func sourceFiles(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(repoRoot, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); p != repoRoot && (strings.HasPrefix(n, ".") || n == "bin" || n == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		switch ext := filepath.Ext(p); {
		case ext == ".go", ext == ".md", ext == ".sh", ext == ".yml", ext == ".sql", ext == ".mjs", d.Name() == "Makefile", d.Name() == "Dockerfile":
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			out[filepath.ToSlash(p[len(repoRoot)+1:])] = string(b)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// No file cites a design document that a clone does not have: the design
// lives in docs/design.md.
func TestNoReferenceToADesignDocumentOutsideTheRepository(t *testing.T) {
	missing := "DESIGN" + ".md" // spelled apart so this file does not match itself
	for path, text := range sourceFiles(t) {
		if strings.Contains(text, missing) {
			t.Errorf("%s cites %s, which is not in the repository; point it into docs/design.md", path, missing)
		}
	}
}

// Every "rule N" a comment or README cites is a rule docs/design.md numbers.
func TestEveryCitedRuleIsNumberedInTheDesign(t *testing.T) {
	design, err := os.ReadFile(filepath.Join(repoRoot, "docs", "design.md"))
	if err != nil {
		t.Fatal(err)
	}
	rules := map[string]bool{}
	section := string(design)
	if i := strings.Index(section, "## The rules"); i >= 0 {
		section = section[i:]
		if j := strings.Index(section[3:], "\n## "); j >= 0 {
			section = section[:j+3]
		}
	}
	for _, m := range regexp.MustCompile(`(?m)^(\d+)\. \*\*`).FindAllStringSubmatch(section, -1) {
		rules[m[1]] = true
	}
	if len(rules) < 8 {
		t.Fatalf("docs/design.md numbers %d rules under \"## The rules\", want at least 8", len(rules))
	}
	cite := regexp.MustCompile(`\brules? (\d+)(?:[–-](\d+))?`)
	for path, text := range sourceFiles(t) {
		if path == "docs/design.md" {
			continue
		}
		for _, m := range cite.FindAllStringSubmatch(text, -1) {
			for _, n := range m[1:] {
				if n != "" && !rules[n] {
					t.Errorf("%s cites %q, but docs/design.md has no rule %s", path, m[0], n)
				}
			}
		}
	}
}
