package cmdutil

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"charm.land/lipgloss/v2"
	"charm.land/lipgloss/v2/table"
	"github.com/spf13/cobra"
	"go.yaml.in/yaml/v3"
)

// Output formats accepted by -o/--output.
const (
	FormatTable = "table"
	FormatJSON  = "json"
	FormatYAML  = "yaml"
)

// Formats lists the output formats in help order.
var Formats = []string{FormatTable, FormatJSON, FormatYAML}

// OutputFormat returns the value of the global -o/--output flag of cmd.
func OutputFormat(cmd *cobra.Command) string {
	if f := cmd.Flag("output"); f != nil {
		return f.Value.String()
	}
	return FormatTable
}

// ValidateFormat returns a usage error for an unknown output format.
func ValidateFormat(format string) error {
	for _, f := range Formats {
		if f == format {
			return nil
		}
	}
	return FlagErrorf("invalid output format %q: want one of %s", format, strings.Join(Formats, ", "))
}

// Table is the tabular form of a result: a header row and data rows.
type Table struct {
	Header []string
	Rows   [][]string
}

// Print writes result in the requested format. JSON is the contract: result's json tags decide
// the field names, and YAML is derived from that JSON so the two never disagree. The table form
// comes from rows, which may be nil for results that only have a structured form.
func Print(s *IOStreams, format string, result any, rows func() Table) error {
	switch format {
	case FormatJSON:
		return WriteJSON(s.Out, result)
	case FormatYAML:
		return WriteYAML(s.Out, result)
	case FormatTable, "":
		if rows == nil {
			return WriteYAML(s.Out, result)
		}
		return WriteTable(s, rows())
	default:
		return ValidateFormat(format)
	}
}

// WriteJSON writes v as indented JSON followed by a newline.
func WriteJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}

// WriteYAML writes v as YAML with the field names and order of its JSON form.
func WriteYAML(w io.Writer, v any) error {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return err
	}
	var node yaml.Node
	if err := yaml.Unmarshal(buf.Bytes(), &node); err != nil {
		return fmt.Errorf("convert to yaml: %w", err)
	}
	blockStyle(&node)
	ye := yaml.NewEncoder(w)
	ye.SetIndent(2)
	if err := ye.Encode(&node); err != nil {
		return err
	}
	return ye.Close()
}

// blockStyle turns the flow style that JSON parses into into YAML's block style. The encoder
// still quotes any string that would otherwise read back as another type.
func blockStyle(n *yaml.Node) {
	n.Style = 0
	for _, c := range n.Content {
		blockStyle(c)
	}
}

// WriteTable renders t: on a terminal with lipgloss, otherwise as tab-separated text with a
// header row so that pipes and scripts get stable columns.
func WriteTable(s *IOStreams, t Table) error {
	if !s.IsStdoutTTY() {
		var b strings.Builder
		b.WriteString(strings.Join(t.Header, "\t"))
		b.WriteByte('\n')
		for _, r := range t.Rows {
			b.WriteString(strings.Join(r, "\t"))
			b.WriteByte('\n')
		}
		_, err := io.WriteString(s.Out, b.String())
		return err
	}
	tbl := table.New().Headers(t.Header...).Rows(t.Rows...).
		Border(lipgloss.HiddenBorder()).BorderHeader(true).BorderColumn(false)
	if s.ColorEnabled() {
		header := lipgloss.NewStyle().Bold(true).Foreground(lipgloss.Color("12")).Padding(0, 1)
		cell := lipgloss.NewStyle().Padding(0, 1)
		tbl = tbl.StyleFunc(func(row, _ int) lipgloss.Style {
			if row == table.HeaderRow {
				return header
			}
			return cell
		})
	} else {
		cell := lipgloss.NewStyle().Padding(0, 1)
		tbl = tbl.StyleFunc(func(int, int) lipgloss.Style { return cell })
	}
	_, err := lipgloss.Fprintln(s.Out, tbl.String())
	return err
}
