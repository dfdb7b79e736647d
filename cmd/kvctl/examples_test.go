package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestREADMEExamples runs every bin/kvctl command of the README's Examples section that needs no
// live pool, from the repository root, against the files under examples/: each must exist and
// succeed.
func TestREADMEExamples(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	section := string(readme)
	if i := strings.Index(section, "\n## Examples\n"); i >= 0 {
		section = section[i:]
	}
	if i := strings.Index(section[1:], "\n## "); i >= 0 {
		section = section[:i+1]
	}
	if strings.Count(string(readme), "\n## Examples\n") != 1 {
		t.Error("the README must have one Examples section")
	}
	if strings.Contains(string(readme), "go install github.com/kvctl/kvctl/cmd/kvctl@latest") {
		t.Error("the README tells to go install a module that is not published")
	}
	// Join continued lines, then take the commands.
	text := strings.ReplaceAll(section, "\\\n", " ")
	var cmds []string
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(line), "$ "))
		if !strings.HasPrefix(line, "bin/kvctl ") {
			continue
		}
		if strings.Contains(line, "--pool ") { // needs a live pool
			continue
		}
		if i := strings.Index(line, "  #"); i >= 0 {
			line = strings.TrimSpace(line[:i])
		}
		cmds = append(cmds, line)
	}
	if len(cmds) < 8 {
		t.Fatalf("found %d commands in the README's Examples", len(cmds))
	}
	files := regexp.MustCompile(`examples/[a-z_]+\.[a-z]+`)
	dir := t.TempDir()
	for _, c := range cmds {
		for _, f := range files.FindAllString(c, -1) {
			if _, err := os.Stat(filepath.Join("../..", f)); err != nil {
				t.Errorf("%s: %v", c, err)
			}
		}
		// Outputs go to a scratch folder; bin/kvctl is the binary under test.
		shell := strings.ReplaceAll(c, "bin/kvctl ", "kvctl ")
		shell = strings.ReplaceAll(shell, "> mooncake.json", "> "+filepath.Join(dir, "mooncake.json"))
		shell = strings.ReplaceAll(shell, "--plot hits.png", "--plot "+filepath.Join(dir, "hits.png"))
		cmd := exec.Command("sh", "-c", shell)
		cmd.Dir = "../.."
		cmd.Env = append(os.Environ(), "XDG_CONFIG_HOME="+dir, "NO_COLOR=1")
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil {
			t.Errorf("%s: %v\n%s", c, err, out.String())
		}
	}
}
