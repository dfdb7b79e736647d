package transfer_test

import (
	"context"
	"fmt"
	"os"
	"testing"

	"github.com/kvctl/kvctl/mooncake/transfer"
)

// BenchmarkTransferLoopback moves 64 KiB and 1 MiB pages between two processes over loopback,
// one transfer at a time as a synchronous caller does:
//
//   - kvctl->kvctl: this process's Client against a kvctl Server in a child process;
//   - python->python: the real Python TransferEngine reading from / writing to another one
//     (the same-run baseline);
//   - kvctl->python and python->kvctl: the mixed pairs.
//
// Every row's target is in another process than its initiator. The Python rows time b.N
// transfer_sync_* calls inside the initiator plus one command round trip. cpu-ns/op is the CPU
// time initiator and target processes used together per transfer (from /proc; the kvctl
// initiator is this test process), a figure a loaded machine disturbs less than wall time;
// init-cpu-ns/op and target-cpu-ns/op split it. The Python initiator polls for completion, so
// its CPU time grows with the wait.
func BenchmarkTransferLoopback(b *testing.B) {
	metaURL := startMaster(b)
	const bufSize = 4 << 20
	pyTarget := startPyPeer(b, metaURL, uniqueName("pyA"), bufSize)
	pyInit := startPyPeer(b, metaURL, uniqueName("pyB"), bufSize)
	kvName := uniqueName("kv")
	kvAddr, kvPid := startChildServer(b, bufSize, metaURL, kvName)
	self := os.Getpid()

	meta, err := transfer.NewMetadataClient(metaURL, transfer.MetadataOptions{})
	if err != nil {
		b.Fatal(err)
	}
	pyEP, err := meta.Resolve(context.Background(), pyTarget.Name)
	if err != nil {
		b.Fatal(err)
	}
	cl := transfer.NewClient(transfer.ClientOptions{})
	b.Cleanup(func() { _ = cl.Close() })
	ctx := context.Background()

	for _, size := range []int{64 << 10, 1 << 20} {
		label := fmt.Sprintf("%dKiB", size>>10)
		buf := make([]byte, size)
		goRow := func(peer string, addr uint64, op string, initiator, target int) func(b *testing.B) {
			return func(b *testing.B) {
				b.SetBytes(int64(size))
				defer cpuPerOp(b, initiator, target)()
				for b.Loop() {
					var err error
					if op == "read" {
						err = cl.Read(ctx, peer, addr, buf)
					} else {
						err = cl.Write(ctx, peer, addr, buf)
					}
					if err != nil {
						b.Fatal(err)
					}
				}
			}
		}
		pyRow := func(target string, addr uint64, op string, initiator, targetPid int) func(b *testing.B) {
			return func(b *testing.B) {
				b.SetBytes(int64(size))
				defer cpuPerOp(b, initiator, targetPid)()
				out := pyInit.call(b, map[string]any{"op": "bench", "kind": op, "target": target,
					"off": 0, "addr": addr, "len": size, "n": b.N})
				if rc, ok := out["rc"]; ok {
					b.Fatalf("python %s returned %v", op, rc)
				}
			}
		}
		for _, op := range []string{"read", "write"} {
			pyT, pyI := pyTarget.cmd.Process.Pid, pyInit.cmd.Process.Pid
			b.Run("kvctl->kvctl/"+op+"/"+label, goRow(kvAddr, childBase, op, self, kvPid))
			b.Run("python->python/"+op+"/"+label, pyRow(pyTarget.Name, pyTarget.Base, op, pyI, pyT))
			b.Run("kvctl->python/"+op+"/"+label, goRow(pyEP.Addr, pyTarget.Base, op, self, pyT))
			b.Run("python->kvctl/"+op+"/"+label, pyRow(kvName, childBase, op, pyI, kvPid))
		}
	}
}

// BenchmarkTransferParallel is the kvctl->kvctl row with 8 goroutines sharing one Client, as
// a batch get or put drives it; the child server is in another process.
func BenchmarkTransferParallel(b *testing.B) {
	const bufSize = 16 << 20
	kvAddr, _ := startChildServer(b, bufSize, "", "")
	cl := transfer.NewClient(transfer.ClientOptions{})
	b.Cleanup(func() { _ = cl.Close() })
	for _, size := range []int{64 << 10, 1 << 20} {
		for _, op := range []string{"read", "write"} {
			b.Run(fmt.Sprintf("%s/%dKiB", op, size>>10), func(b *testing.B) {
				b.SetBytes(int64(size))
				b.SetParallelism(4) // 4×GOMAXPROCS goroutines
				b.RunParallel(func(pb *testing.PB) {
					buf := make([]byte, size)
					for pb.Next() {
						var err error
						if op == "read" {
							err = cl.Read(context.Background(), kvAddr, childBase, buf)
						} else {
							err = cl.Write(context.Background(), kvAddr, childBase, buf)
						}
						if err != nil {
							b.Error(err)
							return
						}
					}
				})
			})
		}
	}
}

// cpuPerOp samples the CPU time of the initiator and target processes and, when the returned
// func runs at the end of the benchmark, reports each one's and their sum per op.
func cpuPerOp(b *testing.B, initiator, target int) func() {
	i0, t0 := procCPU(b, initiator), procCPU(b, target)
	return func() {
		i, t := procCPU(b, initiator)-i0, procCPU(b, target)-t0
		n := float64(b.N)
		b.ReportMetric(float64((i+t).Nanoseconds())/n, "cpu-ns/op")
		b.ReportMetric(float64(i.Nanoseconds())/n, "init-cpu-ns/op")
		b.ReportMetric(float64(t.Nanoseconds())/n, "target-cpu-ns/op")
	}
}
