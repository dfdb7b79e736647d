package probepool

import (
	"context"
	"fmt"
	"strings"

	"github.com/kvctl/kvctl/core/probe"
)

// diagnose explains what res missed, reading the pool's key listing (bounded) only when the
// probe's own answer cannot tell.
func diagnose(ctx context.Context, listing func(context.Context) ([]string, error), res *Result) *probe.Diagnosis {
	var keys []string
	in := probe.MissInput{
		Tokens: res.Tokens, TokensPerBlock: res.TokensPerBlock,
		Blocks: res.Summary.Blocks, HitBlocks: res.Summary.HitBlocks,
		Holes: res.Summary.Holes, MissingBlocks: res.Summary.MissingBlocks,
		KeysPresent: res.Summary.KeysPresent, Bypassed: res.Bypassed,
	}
	for _, b := range res.Blocks {
		for _, k := range b.Keys {
			keys = append(keys, k.Key)
			in.Present = append(in.Present, k.Present)
		}
	}
	in.Keys = keys
	if len(res.Holes) > 0 {
		in.FirstHoleBlock = res.Holes[0].StartBlock
	}
	return probe.DiagnoseMiss(ctx, in, listing, 0)
}

// writeDiagnosis adds the diagnosis line under the table, unless every block hit.
func writeDiagnosis(b *strings.Builder, res *Result) {
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
