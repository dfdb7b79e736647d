package docs

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

var (
	testName = regexp.MustCompile("`((?:Test|Fuzz|Benchmark)[A-Za-z0-9_]+)`")
	fixture  = regexp.MustCompile("`((?:valid|invalid)/[A-Za-z0-9._-]+)`")
	commit   = regexp.MustCompile(`(?m)^### Commits? (\d+)(?: and (\d+))?:`)
)

// testFuncs returns the Test, Fuzz and Benchmark functions declared in the repository's test
// files, by name.
func testFuncs(t *testing.T, root string) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		for _, decl := range f.Decls {
			if fn, ok := decl.(*ast.FuncDecl); ok && fn.Recv == nil {
				out[fn.Name.Name] = true
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestSeedDocument fails when docs/SEED.md names a test or a config fixture that does not exist,
// or leaves out one of the seed's 20 commits.
func TestSeedDocument(t *testing.T) {
	doc, err := os.ReadFile("SEED.md")
	if err != nil {
		t.Fatal(err)
	}
	funcs := testFuncs(t, "..")
	names := testName.FindAllSubmatch(doc, -1)
	if len(names) < 50 {
		t.Fatalf("SEED.md names only %d tests", len(names))
	}
	for _, m := range names {
		if !funcs[string(m[1])] {
			t.Errorf("SEED.md names %s, which no test file declares", m[1])
		}
	}
	fixtures := fixture.FindAllSubmatch(doc, -1)
	if len(fixtures) < 20 {
		t.Fatalf("SEED.md names only %d fixtures", len(fixtures))
	}
	for _, m := range fixtures {
		path := filepath.Join("..", "core", "config", "testdata", string(m[1]))
		if _, err := os.Stat(path); err != nil {
			t.Errorf("SEED.md names fixture %s: %v", m[1], err)
		}
	}
	seen := map[string]bool{}
	for _, m := range commit.FindAllSubmatch(doc, -1) {
		seen[string(m[1])] = true
		if len(m[2]) > 0 {
			seen[string(m[2])] = true
		}
	}
	for i := 1; i <= 20; i++ {
		if n := strconv.Itoa(i); !seen[n] {
			t.Errorf("SEED.md has no section for commit %d", i)
		}
	}
}
