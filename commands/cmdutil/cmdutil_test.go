package cmdutil

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

func TestExitCode(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want int
	}{
		{"nil", nil, ExitOK},
		{"plain", errors.New("boom"), ExitFailure},
		{"usage", FlagErrorf("bad flag"), ExitUsage},
		{"wrapped usage", fmt.Errorf("ctx: %w", FlagErrorf("bad")), ExitUsage},
		{"validation", ValidationErrorf("invalid"), ExitValidation},
		{"unreachable", Unreachable(errors.New("dial tcp: refused")), ExitUnreachable},
		{"interrupted", fmt.Errorf("run: %w", context.Canceled), ExitInterrupted},
		{"silent", SilentExit(ExitValidation), ExitValidation},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := ExitCode(tt.err); got != tt.want {
				t.Errorf("ExitCode(%v) = %d, want %d", tt.err, got, tt.want)
			}
		})
	}
	if Unreachable(nil) != nil {
		t.Error("Unreachable(nil) must stay nil")
	}
}

type sample struct {
	Name    string   `json:"name"`
	Count   int      `json:"count"`
	Numeric string   `json:"numeric"`
	Flag    string   `json:"flag"`
	Items   []string `json:"items"`
}

func TestPrintFormats(t *testing.T) {
	v := sample{Name: "a/b", Count: 3, Numeric: "0123", Flag: "true", Items: []string{"x", "y"}}
	rows := func() Table {
		return Table{Header: []string{"NAME", "COUNT"}, Rows: [][]string{{v.Name, "3"}}}
	}
	tests := []struct {
		format string
		want   string
	}{
		{FormatJSON, "{\n  \"name\": \"a/b\",\n  \"count\": 3,\n  \"numeric\": \"0123\",\n  \"flag\": \"true\",\n  \"items\": [\n    \"x\",\n    \"y\"\n  ]\n}\n"},
		{FormatYAML, "name: a/b\ncount: 3\nnumeric: \"0123\"\nflag: \"true\"\nitems:\n  - x\n  - y\n"},
		{FormatTable, "NAME\tCOUNT\na/b\t3\n"},
	}
	for _, tt := range tests {
		t.Run(tt.format, func(t *testing.T) {
			ios, _, out, _ := Test()
			if err := Print(ios, tt.format, v, rows); err != nil {
				t.Fatal(err)
			}
			if out.String() != tt.want {
				t.Errorf("got\n%q\nwant\n%q", out.String(), tt.want)
			}
		})
	}
	ios, _, _, _ := Test()
	if err := Print(ios, "xml", v, rows); ExitCode(err) != ExitUsage {
		t.Errorf("unknown format: got %v, want a usage error", err)
	}
}

func TestTableOnTerminal(t *testing.T) {
	ios, _, out, _ := Test()
	ios.SetStdoutTTY(true)
	if err := WriteTable(ios, Table{Header: []string{"BLOCK", "HASH"}, Rows: [][]string{{"0", "abcd"}}}); err != nil {
		t.Fatal(err)
	}
	s := out.String()
	if !strings.Contains(s, "BLOCK") || !strings.Contains(s, "abcd") || strings.Contains(s, "\t") {
		t.Errorf("terminal table should be aligned, not tab-separated:\n%s", s)
	}
	if strings.Contains(s, "\x1b[") {
		t.Errorf("colour disabled, yet escape codes were written:\n%q", s)
	}
}

func newFlagCmd() (*cobra.Command, *string, *int) {
	cmd := &cobra.Command{Use: "x", RunE: func(*cobra.Command, []string) error { return nil }}
	s := cmd.Flags().String("pool-size", "default", "")
	n := cmd.Flags().Int("tokens-per-block", 32, "")
	return cmd, s, n
}

func TestLoadConfigPrecedence(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(cfg, []byte("pool-size: from-file\ntokens-per-block: 64\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	getenv := func(string) string { return "" }

	t.Run("file over default", func(t *testing.T) {
		cmd, s, n := newFlagCmd()
		if _, err := LoadConfig(cmd, cfg, getenv); err != nil {
			t.Fatal(err)
		}
		if *s != "from-file" || *n != 64 {
			t.Errorf("got %q %d, want from-file 64", *s, *n)
		}
	})
	t.Run("env over file", func(t *testing.T) {
		t.Setenv("KVCTL_POOL_SIZE", "from-env")
		cmd, s, n := newFlagCmd()
		if _, err := LoadConfig(cmd, cfg, getenv); err != nil {
			t.Fatal(err)
		}
		if *s != "from-env" || *n != 64 {
			t.Errorf("got %q %d, want from-env 64", *s, *n)
		}
	})
	t.Run("flag over env", func(t *testing.T) {
		t.Setenv("KVCTL_POOL_SIZE", "from-env")
		cmd, s, _ := newFlagCmd()
		if err := cmd.Flags().Set("pool-size", "from-flag"); err != nil {
			t.Fatal(err)
		}
		if _, err := LoadConfig(cmd, cfg, getenv); err != nil {
			t.Fatal(err)
		}
		if *s != "from-flag" {
			t.Errorf("got %q, want from-flag", *s)
		}
	})
	t.Run("default when nothing set", func(t *testing.T) {
		cmd, s, n := newFlagCmd()
		if _, err := LoadConfig(cmd, "", func(k string) string {
			if k == "XDG_CONFIG_HOME" {
				return filepath.Join(dir, "absent")
			}
			return ""
		}); err != nil {
			t.Fatal(err)
		}
		if *s != "default" || *n != 32 {
			t.Errorf("got %q %d, want defaults", *s, *n)
		}
	})
	t.Run("bad value names its source", func(t *testing.T) {
		t.Setenv("KVCTL_TOKENS_PER_BLOCK", "many")
		cmd, _, _ := newFlagCmd()
		_, err := LoadConfig(cmd, cfg, getenv)
		if ExitCode(err) != ExitUsage || !strings.Contains(err.Error(), "KVCTL_TOKENS_PER_BLOCK") {
			t.Errorf("got %v, want a usage error naming KVCTL_TOKENS_PER_BLOCK", err)
		}
	})
	t.Run("missing explicit file", func(t *testing.T) {
		cmd, _, _ := newFlagCmd()
		_, err := LoadConfig(cmd, filepath.Join(dir, "nope.yaml"), getenv)
		if err == nil || !strings.Contains(err.Error(), "nope.yaml") {
			t.Errorf("got %v, want an error naming the file", err)
		}
	})
	t.Run("malformed file", func(t *testing.T) {
		bad := filepath.Join(dir, "bad.yaml")
		if err := os.WriteFile(bad, []byte("pool-size: [unclosed\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		cmd, _, _ := newFlagCmd()
		_, err := LoadConfig(cmd, bad, getenv)
		if ExitCode(err) != ExitValidation || !strings.Contains(err.Error(), "bad.yaml") {
			t.Errorf("got %v, want a validation error naming the file", err)
		}
	})
}

func TestParseLogLevel(t *testing.T) {
	for _, ok := range []string{"debug", "info", "warn", "error", "INFO"} {
		if _, err := ParseLogLevel(ok); err != nil {
			t.Errorf("%s: %v", ok, err)
		}
	}
	if _, err := ParseLogLevel("loud"); err == nil {
		t.Error("loud: want an error")
	}
	if err := ValidateLogFormat("xml"); err == nil {
		t.Error("xml: want an error")
	}
}
