package keys

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The serializers are checked against the real thing: random block tuples are built in Python
// from the same description and serialized by pickle (protocol 5, CPython's C pickler), cbor2
// (canonical=True) and msgpack, and xxh3-128 is checked against the xxhash module. pickle comes
// with Python; cbor2, xxhash and msgpack are looked for in the interpreter KVCTL_PYFUZZ_PYTHON
// names (default python3), and their checks skip, naming the module, when it lacks them.

const pyOracle = `
import sys, json, pickle
mods = {}
for m in ("cbor2", "msgpack", "xxhash"):
    try:
        mods[m] = __import__(m)
    except ImportError:
        pass
print(json.dumps(sorted(mods)), flush=True)

def build(v):
    if v is None or isinstance(v, int):
        return v
    if "s" in v:
        s = v["s"]
        # A fresh object per occurrence, as an engine's request fields are; CPython itself
        # returns its shared singletons for "" and one latin-1 character.
        return s.encode("utf-8").decode("utf-8")
    if "b" in v:
        return bytes.fromhex(v["b"])
    return tuple(build(x) for x in v["t"])

for line in sys.stdin:
    req = json.loads(line)
    if "xxh" in req:
        data = bytes.fromhex(req["xxh"])
        print(mods["xxhash"].xxh3_128_digest(data).hex() if "xxhash" in mods else "", flush=True)
        continue
    if "str" in req:
        obj = build({"s": req["str"]})
    else:
        extra = None if req["extra"] is None else build({"t": req["extra"]})
        obj = (bytes.fromhex(req["parent"]), tuple(req["tokens"]), extra)
    out = [pickle.dumps(obj, protocol=5).hex()]
    out.append(mods["cbor2"].dumps(obj, canonical=True).hex() if "cbor2" in mods else "")
    out.append(mods["msgpack"].packb(obj, use_bin_type=True).hex() if "msgpack" in mods else "")
    print(" ".join(out), flush=True)
`

type pyOracleProc struct {
	t    *testing.T
	in   *json.Encoder
	out  *bufio.Scanner
	mods map[string]bool
}

func startPyOracle(t *testing.T) *pyOracleProc {
	t.Helper()
	python := os.Getenv("KVCTL_PYFUZZ_PYTHON")
	if python == "" {
		python = "python3"
	}
	if _, err := exec.LookPath(python); err != nil {
		t.Skipf("no %s to compare the serializers with: %v", python, err)
	}
	script := filepath.Join(t.TempDir(), "oracle.py")
	if err := os.WriteFile(script, []byte(pyOracle), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(python, script)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = stdin.Close()
		if err := cmd.Wait(); err != nil {
			t.Errorf("python oracle: %v\n%s", err, stderr.String())
		}
	})
	sc := bufio.NewScanner(stdout)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	o := &pyOracleProc{t: t, in: json.NewEncoder(stdin), out: sc, mods: map[string]bool{}}
	var mods []string
	if !sc.Scan() || json.Unmarshal(sc.Bytes(), &mods) != nil {
		t.Fatalf("python oracle did not start: %s", stderr.String())
	}
	for _, m := range mods {
		o.mods[m] = true
	}
	return o
}

func (o *pyOracleProc) ask(req any) string {
	o.t.Helper()
	if err := o.in.Encode(req); err != nil {
		o.t.Fatal(err)
	}
	if !o.out.Scan() {
		o.t.Fatalf("python oracle stopped: %v", o.out.Err())
	}
	return o.out.Text()
}

// pyJSON writes o in the oracle's description.
func pyJSON(o pyObj) any {
	switch o.kind {
	case pyNone:
		return nil
	case pyInt:
		return o.i
	case pyStr:
		return map[string]string{"s": o.s}
	case pyBytes:
		return map[string]string{"b": hex.EncodeToString([]byte(o.s))}
	default:
		items := make([]any, len(o.items))
		for i, it := range o.items {
			items[i] = pyJSON(it)
		}
		return map[string]any{"t": items}
	}
}

// Random values at every encoding's width boundaries.
var intEdges = []int64{0, 1, 23, 24, 127, 128, 255, 256, 65535, 65536, 1<<31 - 1, 1 << 31, 1<<32 - 1, 1 << 32,
	1<<63 - 1, -1, -24, -25, -32, -33, -128, -129, -32768, -32769, -1 << 31, -1<<31 - 1, -1 << 32, -1<<32 - 1,
	math.MinInt64, math.MinInt64 + 1, -1 << 55, 1 << 55, -1<<56 - 1, 0x7fffffffffff, -0x800000000000}

var strPool = []string{"", "a", "é", "ÿ", "Ā", "β", "テナント-β", "ab", "sql-adapter", "img-0", "адаптер", "🙂",
	strings.Repeat("x", 31), strings.Repeat("y", 32), strings.Repeat("z", 255), strings.Repeat("w", 256), strings.Repeat("é", 200)}

func randInt(r *rand.Rand) int64 {
	switch r.IntN(4) {
	case 0:
		return intEdges[r.IntN(len(intEdges))]
	case 1:
		return int64(r.Uint64())
	case 2:
		return r.Int64N(200000) - 1000
	default:
		return intEdges[r.IntN(len(intEdges))] + r.Int64N(5) - 2
	}
}

func randStr(r *rand.Rand) string {
	if r.IntN(3) == 0 {
		n := r.IntN(300)
		b := make([]rune, n)
		for i := range b {
			b[i] = rune(r.IntN(0x3000))
			if b[i] >= 0xd800 && b[i] < 0xe000 {
				b[i] = 'q'
			}
		}
		return string(b)
	}
	return strPool[r.IntN(len(strPool))]
}

func randObj(r *rand.Rand, depth int) pyObj {
	switch k := r.IntN(6); {
	case k == 0:
		return pyObj{}
	case k == 1:
		return pyIntOf(randInt(r))
	case k == 2:
		b := make([]byte, []int{0, 16, 32, 255, 256, 300}[r.IntN(6)])
		for i := range b {
			b[i] = byte(r.Uint32())
		}
		return pyBytesOf(b)
	case k == 3 || depth > 2:
		return pyStrOf(randStr(r))
	default:
		n := r.IntN(6)
		items := make([]pyObj, n)
		for i := range items {
			items[i] = randObj(r, depth+1)
		}
		return pyTupleOf(items...)
	}
}

// TestPySerializersMatchPython compares the pickle, CBOR and MessagePack encoders with Python's
// on random block tuples and seed strings.
func TestPySerializersMatchPython(t *testing.T) {
	o := startPyOracle(t)
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 7))
	sers := []pySerializer{pickleSer{}, cborSer{}, msgpackSer{}}
	mods := []string{"", "cbor2", "msgpack"}
	for _, m := range mods[1:] {
		if !o.mods[m] {
			t.Logf("python lacks %s: its encoder is checked only against engine-keys.json (pip install %s)", m, m)
		}
	}
	n := 400
	if testing.Short() {
		n = 50
	}
	for i := 0; i < n; i++ {
		parent := make([]byte, []int{16, 32}[r.IntN(2)])
		for j := range parent {
			parent[j] = byte(r.Uint32())
		}
		tokens := make([]int64, []int{1, 2, 3, 4, 16, 23, 24, 300, 3000}[r.IntN(9)])
		for j := range tokens {
			tokens[j] = randInt(r)
		}
		var extra []pyObj
		var extraJSON any
		if r.IntN(4) > 0 {
			extra = make([]pyObj, r.IntN(5))
			items := make([]any, len(extra))
			for j := range extra {
				extra[j] = randObj(r, 1)
				items[j] = pyJSON(extra[j])
			}
			extraJSON = items
		}
		want := strings.Split(o.ask(map[string]any{"parent": hex.EncodeToString(parent), "tokens": tokens, "extra": extraJSON}), " ")
		for si, ser := range sers {
			if mods[si] != "" && !o.mods[mods[si]] {
				continue
			}
			got, err := ser.appendBlock(nil, parent, tokens, extra)
			if errors.Is(err, ErrPreimageTooLarge) && len(want[si])/2 >= pickleFrameLimit {
				continue
			}
			if err != nil {
				t.Fatalf("%s: %v", ser.name(), err)
			}
			if hex.EncodeToString(got) != want[si] {
				t.Fatalf("%s of tokens %v extra %+v\n got %x\nwant %s", ser.name(), tokens, extra, got, want[si])
			}
		}
	}
	for i := 0; i < 100; i++ {
		s := randStr(r)
		want := strings.Split(o.ask(map[string]any{"str": s}), " ")
		for si, ser := range sers {
			if mods[si] != "" && !o.mods[mods[si]] {
				continue
			}
			got, err := ser.appendStr(nil, s)
			if err != nil {
				t.Fatal(err)
			}
			if hex.EncodeToString(got) != want[si] {
				t.Fatalf("%s of %q\n got %x\nwant %s", ser.name(), s, got, want[si])
			}
		}
	}
}

// TestPickleFrameLimit checks the one-frame limit against CPython: every block under 64 KiB is
// encoded exactly, and a block the encoder refuses is one CPython writes in more than one frame.
func TestPickleFrameLimit(t *testing.T) {
	o := startPyOracle(t)
	parent := bytes.Repeat([]byte{1}, 32)
	for _, n := range []int{13000, 13100, 13105, 13106, 13107, 13108, 13110, 13200, 21845, 21846, 30000} {
		tokens := make([]int64, n)
		for i := range tokens {
			tokens[i] = int64(1000 + i%50000) // BININT2: 3 bytes a token
		}
		want, _ := hex.DecodeString(strings.Split(o.ask(map[string]any{"parent": hex.EncodeToString(parent), "tokens": tokens, "extra": nil}), " ")[0])
		got, err := pickleSer{}.appendBlock(nil, parent, tokens, nil)
		switch {
		case errors.Is(err, ErrPreimageTooLarge):
			if bytes.Count(want, []byte{pkFrame}) < 2 && len(want) < pickleFrameLimit {
				t.Errorf("%d tokens: refused, but CPython writes one frame of %d bytes", n, len(want))
			}
		case err != nil:
			t.Fatal(err)
		case !bytes.Equal(got, want):
			t.Errorf("%d tokens: %d bytes differ from CPython's %d", n, len(got), len(want))
		}
	}
}

// TestXXH3MatchesPython checks xxh3-128 in vLLM's digest form (canonical, big-endian) on random
// inputs of every length class the algorithm distinguishes.
func TestXXH3MatchesPython(t *testing.T) {
	if got := hex.EncodeToString(xxh3Sum(nil, []byte("abc"))); got != "06b05ab6733a618578af5f94892f3950" {
		t.Fatalf("xxh3_128(abc) = %s", got)
	}
	o := startPyOracle(t)
	if !o.mods["xxhash"] {
		t.Skip("python lacks xxhash (pip install xxhash); checked against engine-keys.json only")
	}
	r := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{0, 1, 3, 4, 8, 9, 16, 17, 128, 129, 240, 241, 1024, 1025, 4096, 100000} {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(r.Uint32())
		}
		if got, want := hex.EncodeToString(xxh3Sum(nil, b)), o.ask(map[string]string{"xxh": hex.EncodeToString(b)}); got != want {
			t.Errorf("%d bytes: %s, want %s", n, got, want)
		}
	}
}
