package adversarial

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/kvctl/kvctl/core/enginesim"
	"github.com/kvctl/kvctl/core/statsapi"
	"github.com/kvctl/kvctl/mooncake/mooncaketest"
	"github.com/kvctl/kvctl/mooncake/transfer"
)

const (
	poisonT    = 16   // tokens per block
	poisonPage = 4096 // bytes per page
)

// poisonRequests are n requests of blocks blocks each over a shared first block, with a unique
// last token so every block is offerable.
func poisonRequests(n, blocks int, suffix string) []enginesim.Request {
	out := make([]enginesim.Request, n)
	for r := range n {
		toks := make([]int64, 0, blocks*poisonT+1)
		for b := range blocks {
			for i := range poisonT {
				id := int64(r*blocks + b)
				if b == 0 {
					id = 0
				}
				toks = append(toks, 1+id*poisonT+int64(i))
			}
		}
		toks = append(toks, 1_000_000_000+int64(r))
		out[r] = enginesim.Request{ID: fmt.Sprintf("p%02d-%s", r, suffix), Tokens: toks}
	}
	return out
}

func runSim(t *testing.T, socket, name string, reqs []enginesim.Request) (enginesim.Result, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	e, err := enginesim.Start(ctx, enginesim.Config{Socket: socket, ModelKey: "poison-model", Name: name,
		TokensPerBlock: poisonT, Slots: 256, PageBytes: []int{poisonPage}, Chunk: 8 * poisonT})
	if err != nil {
		t.Fatal(err)
	}
	res, runErr := e.Run(ctx, reqs, 2)
	if err := e.Close(ctx); err != nil && runErr == nil {
		t.Fatal(err)
	}
	return res, runErr
}

func getBody(t *testing.T, u string) string {
	t.Helper()
	c := &http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("GET %s: %d %v %s", u, resp.StatusCode, err, b)
	}
	return string(b)
}

// poisonPool rewrites every object of the pool in its segment through the segment owner's
// Transfer Engine port, as any network peer can: the master still lists them, with the
// checksums they were put with. It returns how many pages it rewrote.
func poisonPool(t *testing.T, m *mooncaketest.Master) int {
	t.Helper()
	var keys []string
	for _, k := range strings.Split(getBody(t, m.AdminURL+"/get_all_keys"), "\n") {
		if k = strings.TrimSpace(k); k != "" {
			keys = append(keys, k)
		}
	}
	if len(keys) == 0 {
		t.Fatal("the pool holds no object to poison")
	}
	var q struct {
		Data map[string]struct {
			OK     bool `json:"ok"`
			Values []struct {
				Size     uint64 `json:"size_"`
				Addr     uint64 `json:"buffer_address_"`
				Endpoint string `json:"transport_endpoint_"`
			} `json:"values"`
		} `json:"data"`
	}
	if err := json.Unmarshal([]byte(getBody(t, m.AdminURL+"/batch_query_keys?keys="+url.QueryEscape(strings.Join(keys, ",")))), &q); err != nil {
		t.Fatal(err)
	}
	te := transfer.NewClient(transfer.ClientOptions{Timeout: 10 * time.Second})
	ctx := context.Background()
	n := 0
	for k, r := range q.Data {
		if !r.OK {
			continue
		}
		for _, v := range r.Values {
			garbage := []byte(strings.Repeat("poisoned", int(v.Size)/8+1))[:v.Size]
			// The segment's Transfer Engine server listens on the endpoint's host at the port
			// published on the metadata server; kvctl serve names its segment after it.
			if err := te.Write(ctx, v.Endpoint, v.Addr, garbage); err != nil {
				t.Fatalf("rewriting %s at %s %#x: %v", k, v.Endpoint, v.Addr, err)
			}
			n++
		}
	}
	return n
}

func poolStats(t *testing.T, p *serveProc) statsapi.StatsJSON {
	t.Helper()
	var st statsapi.StatsJSON
	if err := json.Unmarshal([]byte(getBody(t, "http://"+p.admin+"/v1/stats")), &st); err != nil {
		t.Fatal(err)
	}
	return st
}

// TestPoisonedPage: the Mooncake-mode attack on page integrity. Host A saves pages into its
// segment; a network peer rewrites every one of them through A's Transfer Engine port; host B
// then loads them. Without --object-checksum B's engine gets the attacker's bytes (the attack
// works, which the first case pins); with it on both hosts, every poisoned page is refused,
// counted in checksum_errors and recomputed, the engine sees no wrong byte, and a later run
// loads the recomputed pages.
func TestPoisonedPage(t *testing.T) {
	cold := poisonRequests(8, 4, "cold")
	for _, c := range []struct {
		name     string
		checksum bool
	}{{"without object-checksum", false}, {"with object-checksum", true}} {
		t.Run(c.name, func(t *testing.T) {
			m := mooncaketest.StartMaster(t, mooncaketest.MasterOptions{})
			args := mooncakeArgs(m, m.AdminURL)
			if c.checksum {
				args = append(args, "--object-checksum")
			}
			a := startServe(t, serveOpts{args: args})
			waitReadyz(t, a, 200)
			if res, err := runSim(t, a.socket, "cold", cold); err != nil || res.ComputedBlocks == 0 {
				t.Fatalf("cold run on A: %+v, %v", res, err)
			}
			b := startServe(t, serveOpts{args: args})
			waitReadyz(t, b, 200)
			n := poisonPool(t, m)

			warm, err := runSim(t, b.socket, "warm", poisonRequests(8, 4, "warm"))
			if !c.checksum {
				if !errors.Is(err, enginesim.ErrWrongBytes) {
					t.Fatalf("without checksums the %d rewritten pages were not served to B's engine: %+v, %v", n, warm, err)
				}
				return
			}
			if err != nil {
				t.Fatalf("B's engine with checksums on: %v (%+v)", err, warm)
			}
			st := poolStats(t, b)
			// Every page B's engine loaded was checked byte for byte (no ErrWrongBytes): the ones
			// it loaded are pages recomputed and saved again during the run.
			if warm.Restarts == 0 || warm.ComputedBlocks == 0 || st.Pool.ChecksumErrors < int64(n) {
				t.Fatalf("warm run over %d poisoned pages: %+v, checksum_errors %d; want failed loads recomputed and every poisoned page counted",
					n, warm, st.Pool.ChecksumErrors)
			}
			// The refused objects were removed and saved again by B: a third run loads them.
			again, err := runSim(t, b.socket, "again", poisonRequests(8, 4, "again"))
			if err != nil || again.LoadedBlocks == 0 {
				t.Fatalf("run after the recompute: %+v, %v; want the recomputed pages loaded", again, err)
			}
			a.alive(t)
			b.alive(t)
			t.Logf("%d pages poisoned; warm run %+v with %d checksum errors; again %+v", n, warm, st.Pool.ChecksumErrors, again)
		})
	}
}
