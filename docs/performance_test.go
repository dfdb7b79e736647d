package docs

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// summaryHeader is the header PERFORMANCE.md's summary table must have, cell for cell.
var summaryHeader = []string{"area", "what", "goal", "current", "met", "machine", "details"}

// metValues are the values a summary row's met cell may hold, bold or not.
var metValues = map[string]bool{"yes": true, "no": true, "partly": true, "—": true}

var (
	mdLink     = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	mdHeading  = regexp.MustCompile(`(?m)^#{1,6} +(.+?) *$`)
	slugStrip  = regexp.MustCompile(`[^\p{L}\p{N} _-]`)
	codeInCell = regexp.MustCompile("`[^`]*`")
)

// tableCells splits a Markdown table row into its trimmed cells; pipes inside code spans do not
// split.
func tableCells(line string) []string {
	masked := codeInCell.ReplaceAllStringFunc(line, func(s string) string {
		return strings.ReplaceAll(s, "|", "\x00")
	})
	masked = strings.TrimSpace(masked)
	masked = strings.TrimPrefix(masked, "|")
	masked = strings.TrimSuffix(masked, "|")
	cells := strings.Split(masked, "|")
	for i, c := range cells {
		cells[i] = strings.TrimSpace(strings.ReplaceAll(c, "\x00", "|"))
	}
	return cells
}

// summaryTable returns the lines of the first table under doc's "## Summary" heading: the header,
// the delimiter row and the rows.
func summaryTable(t *testing.T, doc string) []string {
	t.Helper()
	_, rest, ok := strings.Cut(doc, "\n## Summary\n")
	if !ok {
		t.Fatal(`PERFORMANCE.md has no "## Summary" heading`)
	}
	var table []string
	for _, line := range strings.Split(rest, "\n") {
		if strings.HasPrefix(line, "## ") {
			break
		}
		if strings.HasPrefix(strings.TrimSpace(line), "|") {
			table = append(table, line)
		} else if len(table) > 0 {
			break
		}
	}
	if len(table) < 3 {
		t.Fatalf("PERFORMANCE.md's summary table has %d lines, want a header, a delimiter and rows", len(table))
	}
	return table
}

// anchors returns the GitHub-style anchors of the Markdown headings in doc.
func anchors(doc string) map[string]bool {
	out := map[string]bool{}
	for _, m := range mdHeading.FindAllStringSubmatch(doc, -1) {
		s := strings.ToLower(m[1])
		s = slugStrip.ReplaceAllString(s, "")
		out[strings.ReplaceAll(s, " ", "-")] = true
	}
	return out
}

// checkLink reports an error when target, a link in PERFORMANCE.md, names a file that does not
// exist or a heading that the file does not have.
func checkLink(t *testing.T, row int, target, self string) {
	t.Helper()
	if strings.Contains(target, "://") {
		return
	}
	path, anchor, _ := strings.Cut(target, "#")
	doc, name := self, "PERFORMANCE.md"
	if path != "" {
		name = path
		b, err := os.ReadFile(filepath.FromSlash(path))
		if err != nil {
			t.Errorf("summary row %d links %s: %v", row, target, err)
			return
		}
		doc = string(b)
	}
	if anchor != "" && (path == "" || strings.HasSuffix(path, ".md")) {
		if !anchors(doc)[anchor] {
			t.Errorf("summary row %d links %s, but %s has no heading with that anchor", row, target, name)
		}
	}
}

// TestPerformanceSummary fails when docs/PERFORMANCE.md's summary table leaves the format its
// heading describes: the header is not the seven columns, a row has another number of cells, a
// met cell is not yes, no, partly or —, or a details link leads to no file or heading.
func TestPerformanceSummary(t *testing.T) {
	b, err := os.ReadFile("PERFORMANCE.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	table := summaryTable(t, doc)
	header := tableCells(table[0])
	if strings.Join(header, "|") != strings.Join(summaryHeader, "|") {
		t.Fatalf("summary header is %q, want %q", header, summaryHeader)
	}
	if cells := tableCells(table[1]); len(cells) != len(summaryHeader) {
		t.Errorf("summary delimiter row has %d cells, want %d", len(cells), len(summaryHeader))
	}
	rows := table[2:]
	if len(rows) < 20 {
		t.Fatalf("summary table has only %d rows", len(rows))
	}
	for i, line := range rows {
		row := i + 1
		cells := tableCells(line)
		if len(cells) != len(summaryHeader) {
			t.Errorf("summary row %d has %d cells, want %d: %s", row, len(cells), len(summaryHeader), line)
			continue
		}
		met := strings.TrimSuffix(strings.TrimPrefix(cells[4], "**"), "**")
		if !metValues[met] {
			t.Errorf("summary row %d: met is %q, want yes, no, partly or —", row, cells[4])
		}
		if met == "—" && cells[2] != "" {
			t.Errorf("summary row %d has the goal %q but met —", row, cells[2])
		}
		if met != "—" && cells[2] == "" {
			t.Errorf("summary row %d has no goal but met %q", row, cells[4])
		}
		if cells[3] == "" || cells[5] == "" {
			t.Errorf("summary row %d has an empty current or machine cell", row)
		}
		links := mdLink.FindAllStringSubmatch(cells[6], -1)
		if len(links) == 0 {
			t.Errorf("summary row %d: details %q has no link", row, cells[6])
		}
		for _, l := range links {
			checkLink(t, row, l[1], doc)
		}
	}
}
