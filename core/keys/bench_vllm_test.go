package keys

import (
	"bufio"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
)

// vllmPython is a long-lived python3 running testdata/vllm_chain.py: vLLM's sha256 block hash
// chain written with hashlib and pickle, as vLLM itself computes it.
type vllmPython struct {
	cmd *exec.Cmd
	in  *os.File
	out *bufio.Scanner
}

func startVLLMPython(b *testing.B, tokens []int64, seed string) *vllmPython {
	b.Helper()
	python := os.Getenv("KVCTL_PYFUZZ_PYTHON")
	if python == "" {
		python = "python3"
	}
	if _, err := exec.LookPath(python); err != nil {
		b.Skipf("no %s for the Python baseline: %v", python, err)
	}
	prompt := filepath.Join(b.TempDir(), "prompt.json")
	js, err := json.Marshal(tokens)
	if err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(prompt, js, 0o600); err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(python, filepath.Join("testdata", "vllm_chain.py"), prompt, seed)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		b.Fatal(err)
	}
	cmd.Stdout = pw
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	pw.Close()
	p := &vllmPython{cmd: cmd, in: stdin.(*os.File), out: bufio.NewScanner(pr)}
	b.Cleanup(func() {
		stdin.Close()
		_ = cmd.Wait()
		pr.Close()
	})
	return p
}

// run has Python hash the prompt's chain once with block size T and returns its thread CPU
// time, its wall time and the last block hash.
func (p *vllmPython) run(b *testing.B, T int) (cpu, wall time.Duration, last string) {
	if _, err := fmt.Fprintln(p.in, T); err != nil {
		b.Fatal(err)
	}
	if !p.out.Scan() {
		b.Fatalf("python baseline stopped: %v", p.out.Err())
	}
	f := strings.Fields(p.out.Text())
	if len(f) != 3 {
		b.Fatalf("python baseline said %q", p.out.Text())
	}
	c, err1 := strconv.ParseInt(f[0], 10, 64)
	w, err2 := strconv.ParseInt(f[1], 10, 64)
	if err1 != nil || err2 != nil {
		b.Fatalf("python baseline said %q", p.out.Text())
	}
	return time.Duration(c), time.Duration(w), f[2]
}

// BenchmarkVLLMChainVsPython alternates, per iteration, one run of kvctl's vllm scheme
// (Scheme.Derive with no keys: NONE_HASH and the sha256-over-pickle-5 chain) and one run of
// the same chain in Python with hashlib (testdata/vllm_chain.py), on the same 128k-token
// prompt, and reports Python's time / kvctl's time by the thread CPU time of each side
// ("py/go-cpu") and by wall clock ("py/go-wall"). Python times itself, so its start and the
// pipe are not counted. The last block hash of both sides must agree, so both ran the same
// chain.
func BenchmarkVLLMChainVsPython(b *testing.B) {
	tokens := benchTokens(benchPromptTokens)
	seed := "0"
	s, err := LookupScheme("vllm")
	if err != nil {
		b.Fatal(err)
	}
	py := startVLLMPython(b, tokens, seed)
	for _, T := range benchBlockSizes {
		b.Run(fmt.Sprintf("T=%d", T), func(b *testing.B) {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			p := &Params{TokensPerBlock: T, PythonHashSeed: &seed}
			var goWall, pyWall time.Duration
			var goCPU, pyCPU int64
			for b.Loop() {
				start, startCPU := time.Now(), threadCPU()
				r, err := s.Derive(p, tokens, KeySetNone)
				wall, cpu := time.Since(start), threadCPU()-startCPU
				if err != nil {
					b.Fatal(err)
				}
				pc, pw, last := py.run(b, T)
				if got := hex.EncodeToString(r.Blocks[len(r.Blocks)-1].Hash); got != last {
					b.Fatalf("T=%d: kvctl's last block hash %s, Python's %s", T, got, last)
				}
				goWall += wall
				goCPU += cpu
				pyWall += pw
				pyCPU += int64(pc)
			}
			b.ReportMetric(float64(pyCPU)/float64(goCPU), "py/go-cpu")
			b.ReportMetric(float64(pyWall)/float64(goWall), "py/go-wall")
			b.ReportMetric(float64(len(tokens))*float64(b.N)/goWall.Seconds(), "go-tokens/s")
			b.ReportMetric(float64(len(tokens))*float64(b.N)/pyWall.Seconds(), "py-tokens/s")
		})
	}
}
