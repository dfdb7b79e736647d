// Command clustersim replays a Mooncake conversation trace on a simulated cluster of N hosts,
// each with a share of the pool and one network link, and reports how the pool's hit rate and
// the time to load the hits scale with N. It models placement, routing, LRU eviction per
// segment and link queueing; it does not model prefill, decode or the master. docs/mooncake.md
// ("Scaling out, simulated") describes the model and records its results.
//
//	go run ./tools/clustersim --trace ../shared/traces/conversation_trace.jsonl --hosts 8,32,128
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "clustersim:", err)
		os.Exit(2)
	}
}

func run(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("clustersim", flag.ContinueOnError)
	trace := fs.String("trace", "", "Mooncake JSONL trace (required)")
	hosts := fs.String("hosts", "8,32,128", "host counts to simulate, comma separated")
	scaleFrom := fs.Int("scale-from", 0, "replay hosts/N copies of the trace at once, so the load per host stays that of N hosts (0: the trace once for every host count)")
	segment := fs.Float64("segment-gib", 1024, "pool memory per host, GiB")
	tokenBytes := fs.Int64("token-bytes", 327680, "KV bytes per token (327680: 80 layers, 8 KV heads of 128, fp16)")
	link := fs.Float64("link-gbit", 100, "each host's network link, Gbit/s in each direction")
	local := fs.Float64("local-gbyte", 25, "what a host reads from its own segment, GB/s")
	placement := fs.String("placement", "random,local", "where saves go: random and/or local, comma separated")
	router := fs.String("router", "affinity,random", "which host serves a request: affinity and/or random, comma separated")
	replicas := fs.String("replicas", "1", "replicas of each saved block, comma separated")
	seed := fs.Uint64("seed", 1, "seed of the random choices")
	format := fs.String("o", "table", "output: table or json")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *trace == "" {
		return errors.New("--trace is required")
	}
	if *format != "table" && *format != "json" {
		return fmt.Errorf("-o %q: want table or json", *format)
	}
	if !(*segment > 0) || *segment > 1<<30 {
		return fmt.Errorf("--segment-gib %v: want a positive size up to 2^30 GiB", *segment)
	}
	ns, err := intList(*hosts)
	if err != nil {
		return fmt.Errorf("--hosts: %w", err)
	}
	rs, err := intList(*replicas)
	if err != nil {
		return fmt.Errorf("--replicas: %w", err)
	}
	if *scaleFrom < 0 {
		return fmt.Errorf("--scale-from %d: must not be negative", *scaleFrom)
	}
	f, err := os.Open(*trace)
	if err != nil {
		return err
	}
	reqs, err := ReadTrace(f)
	_ = f.Close()
	if err != nil {
		return err
	}
	var results []Result
	for _, n := range ns {
		copies := 1
		if *scaleFrom > 0 {
			if n%*scaleFrom != 0 {
				return fmt.Errorf("--hosts %d is not a multiple of --scale-from %d", n, *scaleFrom)
			}
			copies = n / *scaleFrom
		}
		for _, rep := range rs {
			for _, p := range strings.Split(*placement, ",") {
				for _, r := range strings.Split(*router, ",") {
					res, err := Run(reqs, Config{Hosts: n, Copies: copies, SegmentBytes: int64(*segment * (1 << 30)), TokenBytes: *tokenBytes,
						LinkBandwidth: *link * 1e9 / 8, LocalBandwidth: *local * 1e9, Placement: Placement(p), Router: Router(r),
						Replicas: rep, Seed: *seed})
					if err != nil {
						return err
					}
					results = append(results, res)
				}
			}
		}
	}
	if *format == "json" {
		e := json.NewEncoder(stdout)
		e.SetIndent("", "  ")
		return e.Encode(results)
	}
	w := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "hosts\tcopies\treplicas\tplacement\trouter\thit rate\tremote share\tevictions\tload mean ms\tp50 ms\tp99 ms\tGB/s per load\tbusiest link\t")
	for _, r := range results {
		fmt.Fprintf(w, "%d\t%d\t%d\t%s\t%s\t%.1f%%\t%.1f%%\t%d\t%.1f\t%.1f\t%.1f\t%.2f\t%.1f%%\t\n", r.Hosts, r.Copies, r.Replicas, r.Placement, r.Router,
			100*r.HitRate, 100*r.RemoteShare, r.Evictions, r.LoadMeanMs, r.LoadP50Ms, r.LoadP99Ms, r.LoadGBps, 100*r.LinkBusy)
	}
	return w.Flush()
}

func intList(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil {
			return nil, fmt.Errorf("%q is not a number", f)
		}
		out = append(out, n)
	}
	return out, nil
}
