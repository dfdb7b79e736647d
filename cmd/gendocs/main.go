// Command gendocs writes kvctl's man pages and shell completions. `make docs` runs it; the output
// is committed and `make verify` fails when it drifts from the code.
package main

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/cobra/doc"

	"github.com/kvctl/kvctl/commands/cmdutil"
	"github.com/kvctl/kvctl/commands/root"
)

func main() {
	manDir := flag.String("man", "man", "directory for man pages")
	compDir := flag.String("completions", "completions", "directory for completion scripts")
	prevDir := flag.String("previous", "", "directory of the committed man pages whose dates are kept where a page is unchanged (default: -man)")
	flag.Parse()
	if *prevDir == "" {
		*prevDir = *manDir
	}
	if err := run(*manDir, *compDir, *prevDir, time.Now()); err != nil {
		fmt.Fprintf(os.Stderr, "gendocs: %v\n", err)
		os.Exit(1)
	}
}

func run(manDir, compDir, prevDir string, today time.Time) error {
	ios, _, _, _ := cmdutil.Test()
	f := &cmdutil.Factory{IOStreams: ios, Seams: cmdutil.Seams{Now: time.Now}, Getenv: func(string) string { return "" }}
	cmd := root.NewCmdRoot(f)
	cmd.DisableAutoGenTag = true

	previous := readPages(prevDir)
	if err := os.MkdirAll(manDir, 0o755); err != nil {
		return err
	}
	old, _ := filepath.Glob(filepath.Join(manDir, "*.1"))
	for _, p := range old {
		if err := os.Remove(p); err != nil {
			return err
		}
	}
	// A page is dated when its text last changed: generated with today's date, then given back
	// the committed page's date when nothing but the date differs, so regenerating unchanged pages
	// (make verify) reproduces them byte for byte. The title is left empty so that each page is
	// titled after its command (KVCTL-SERVE(1), ...).
	hdr := &doc.GenManHeader{Section: "1", Source: "kvctl", Manual: "kvctl manual", Date: &today}
	preformatExitCodes(cmd)
	if err := doc.GenManTree(cmd, hdr, manDir); err != nil {
		return fmt.Errorf("man pages: %w", err)
	}
	if err := keepDates(manDir, previous); err != nil {
		return fmt.Errorf("man pages: %w", err)
	}

	if err := os.MkdirAll(compDir, 0o755); err != nil {
		return err
	}
	gens := map[string]func(io.Writer) error{
		"kvctl.bash": func(w io.Writer) error { return cmd.GenBashCompletionV2(w, true) },
		"_kvctl":     cmd.GenZshCompletion,
		"kvctl.fish": func(w io.Writer) error { return cmd.GenFishCompletion(w, true) },
		"kvctl.ps1":  cmd.GenPowerShellCompletionWithDesc,
	}
	for name, gen := range gens {
		var buf bytes.Buffer
		if err := gen(&buf); err != nil {
			return fmt.Errorf("completion %s: %w", name, err)
		}
		if err := os.WriteFile(filepath.Join(compDir, name), buf.Bytes(), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// preformatExitCodes indents the exit-code table of every command's help as a block of
// preformatted text, so that man keeps its rows instead of filling them into one paragraph.
func preformatExitCodes(cmd *cobra.Command) {
	for _, c := range cmd.Commands() {
		preformatExitCodes(c)
	}
	lines := strings.Split(cmdutil.ExitCodesHelp, "\n")
	for i := 1; i < len(lines); i++ {
		lines[i] = "    " + strings.TrimLeft(lines[i], " ")
	}
	pre := lines[0] + "\n\n" + strings.Join(lines[1:], "\n")
	cmd.Long = strings.Replace(cmd.Long, cmdutil.ExitCodesHelp, pre, 1)
}

// readPages reads the man pages of dir by file name; a missing dir has none.
func readPages(dir string) map[string][]byte {
	pages := map[string][]byte{}
	paths, _ := filepath.Glob(filepath.Join(dir, "*.1"))
	for _, p := range paths {
		if b, err := os.ReadFile(p); err == nil {
			pages[filepath.Base(p)] = b
		}
	}
	return pages
}

// splitTH splits a man page into its .TH line (which carries the date) and the rest.
func splitTH(page []byte) (th, rest []byte) {
	for off := 0; off < len(page); {
		end := bytes.IndexByte(page[off:], '\n')
		if end < 0 {
			end = len(page) - off
		} else {
			end++
		}
		if line := page[off : off+end]; bytes.HasPrefix(line, []byte(".TH ")) {
			return line, append(append([]byte{}, page[:off]...), page[off+end:]...)
		}
		off += end
	}
	return nil, page
}

// keepDates gives every generated page whose text equals its previous version's, .TH line
// aside, the previous .TH line back.
func keepDates(manDir string, previous map[string][]byte) error {
	paths, err := filepath.Glob(filepath.Join(manDir, "*.1"))
	if err != nil {
		return err
	}
	for _, p := range paths {
		prev, ok := previous[filepath.Base(p)]
		if !ok {
			continue
		}
		cur, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		curTH, curRest := splitTH(cur)
		prevTH, prevRest := splitTH(prev)
		if curTH == nil || prevTH == nil || !bytes.Equal(curRest, prevRest) || bytes.Equal(curTH, prevTH) {
			continue
		}
		if err := os.WriteFile(p, bytes.Replace(cur, curTH, prevTH, 1), 0o644); err != nil {
			return err
		}
	}
	return nil
}
