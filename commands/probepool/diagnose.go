package probepool

import (
	"fmt"
	"strings"

	"github.com/kvctl/kvctl/core/probe"
)

// writeDiagnosis adds the diagnosis line under the table, unless every block hit.
func writeDiagnosis(b *strings.Builder, res *probe.Report) {
	d := res.Diagnosis
	if d == nil || d.Code == probe.DiagFullHit {
		return
	}
	fmt.Fprintf(b, "why: %s", d.Text)
	if d.Flag != "" {
		fmt.Fprintf(b, "; try %s", d.Flag)
	}
	fmt.Fprintf(b, " [%s]\n", d.Code)
}
