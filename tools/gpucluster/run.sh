#!/usr/bin/env bash
# A two-host Mooncake cluster on one machine, for the GPU host (no Go, no network): the real
# mooncake_master and two `kvctl serve` processes on the Mooncake backend, all from the carry
# folder tools/gpucluster/prepare.sh made, each started with a clean environment. Host A's
# engine (core/daemon/testdata/torch_engine.py, a PyTorch engine on the repository's engine SDK)
# runs the cold pass of every case, so every page lands in A's segment; host B joins only then,
# and B's engine, with fresh GPU memory, loads the same prompts warm from A's segment over the
# Transfer Engine, checking every page on the GPU. Each case prints one RESULT line: B's warm
# loads in GB/s (loaded bytes over the seconds inside StartLoad) against the pinned 64 MiB
# host-to-device copy the engine times in the same run, before and after its passes.
#
#   tools/gpucluster/run.sh [CARRY]     # CARRY: .gpu/cluster.tar.gz (default) or its folder
#
# Environment: PYTHON (python3), MEMORY (cuda; shm runs the same on a machine without a GPU),
# REQUESTS (64), CASES ("PAGE_BYTES:LAYERS:TRANSFER_BATCH ...", the cases of
# TestGPUTorchEngine), POOL_A (4GiB, A's segment), STAGING (256MiB), KEEP=1 keeps the work
# folder, LOGS=DIR copies the master's and both hosts' logs and every pass's output and summary
# into DIR on exit (what a GPU host without a shell afterwards needs to bring back).
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD
carry=${1:-.gpu/cluster.tar.gz}
python=${PYTHON:-python3}
memory=${MEMORY:-cuda}
requests=${REQUESTS:-64}
cases=${CASES:-"1048576:2:0 262144:8:0 65536:2:256"}
pool_a=${POOL_A:-4GiB}
staging=${STAGING:-256MiB}

work=$(mktemp -d /tmp/kvctl-gpucluster.XXXXXX)
pids=()
cleanup() {
	for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
	wait 2>/dev/null || true
	if [[ -n "${LOGS:-}" ]]; then
		mkdir -p "$LOGS" && cp "$work"/*.log "$work"/*.txt "$work"/*.err "$work"/*.json "$LOGS"/ 2>/dev/null
		echo "logs copied to $LOGS"
	fi
	if [[ "${KEEP:-0}" == 1 ]]; then echo "logs kept in $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT

if [[ -f "$carry" ]]; then
	tar xzf "$carry" -C "$work"
	carry="$work/$(basename "$carry" .tar.gz)"
fi
carry=$(cd "$carry" && pwd)
for f in bin/kvctl master/mooncake_master master/lib; do
	[[ -e "$carry/$f" ]] || { echo "run: $carry/$f is missing; make the carry with tools/gpucluster/prepare.sh" >&2; exit 2; }
done

# Free loopback ports, as many as asked.
ports() {
	"$python" - "$1" <<'PY'
import socket, sys
socks = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))
PY
}
# wait_http URL SECONDS LOG: until URL answers 2xx (or, with any=1, anything at all), while the
# process started last lives.
wait_http() {
	"$python" - "$1" "$2" "${any:-0}" "${pids[-1]}" <<'PY' || { echo "run: $1 did not answer; log:" >&2; tail -50 "$3" >&2; exit 1; }
import os, sys, time, urllib.request, urllib.error
url, limit, anyans, pid = sys.argv[1], float(sys.argv[2]), sys.argv[3] == "1", int(sys.argv[4])
end = time.time() + limit
while time.time() < end:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        sys.exit(1)
    try:
        with urllib.request.urlopen(url, timeout=1):
            sys.exit(0)
    except urllib.error.HTTPError:
        if anyans:
            sys.exit(0)
    except Exception:
        pass
    time.sleep(0.1)
sys.exit(1)
PY
}

read -r rpc meta admin ta tb xa xb <<<"$(ports 7)"
env -i PATH=/usr/bin:/bin LD_LIBRARY_PATH="$carry/master/lib" "$carry/master/mooncake_master" \
	--rpc_address=127.0.0.1 --rpc_port="$rpc" \
	--enable_http_metadata_server=true --http_metadata_server_host=127.0.0.1 --http_metadata_server_port="$meta" \
	--metrics_host=127.0.0.1 --metrics_port="$admin" --rpc_thread_num=4 >"$work/master.log" 2>&1 &
pids+=($!)
wait_http "http://127.0.0.1:$admin/health" 30 "$work/master.log"
any=1 wait_http "http://127.0.0.1:$meta/metadata?key=probe" 30 "$work/master.log"
echo "master: rpc 127.0.0.1:$rpc, metadata :$meta, admin :$admin"

# serve NAME TRANSFER_PORT ADMIN_PORT POOL_SIZE
serve() {
	mkdir -m 700 -p "$work/$1" # kvctl serve refuses a socket directory others can enter
	env -i PATH=/usr/bin:/bin HOME="$work/$1" XDG_CONFIG_HOME="$work/$1" NO_COLOR=1 "$carry/bin/kvctl" serve \
		--pool-backend mooncake --master "127.0.0.1:$rpc" --metadata "http://127.0.0.1:$meta/metadata" \
		--master-admin "http://127.0.0.1:$admin" --pool-size "$4" --staging-buffer-bytes "$staging" \
		--transfer-port "$2" --socket "$work/$1/s.sock" --admin-addr "127.0.0.1:$3" --pool-timeout 30s \
		>"$work/$1.log" 2>&1 &
	pids+=($!)
	wait_http "http://127.0.0.1:$3/readyz" 60 "$work/$1.log"
	echo "serve $1: segment 127.0.0.1:$2 ($4), admin :$3"
}

# engine SOCKET PASSES CASE_INDEX PAGE LAYERS BATCH [extra...]
engine() {
	local sock=$1 passes=$2 i=$3 page=$4 layers=$5 batch=$6
	shift 6
	"$python" "$repo/core/daemon/testdata/torch_engine.py" --socket "$sock" --passes "$passes" --memory "$memory" \
		--model-key "cluster-$i-$page" --name "cluster$i" --requests "$requests" --page-bytes "$page" --layers "$layers" \
		--transfer-batch "$batch" "$@"
}

serve A "$ta" "$xa" "$pool_a"
i=0
for c in $cases; do
	IFS=: read -r page layers batch <<<"$c"
	engine "$work/A/s.sock" cold "$i" "$page" "$layers" "$batch" >"$work/cold-$i.txt" 2>"$work/cold-$i.err" ||
		{ echo "run: cold pass of case $c failed:" >&2; tail -30 "$work/cold-$i.err" >&2; exit 1; }
	grep '^SUMMARY ' "$work/cold-$i.txt" | "$python" -c 'import json,sys; s=json.loads(sys.stdin.read()[8:]); c=s["cold"]; print("A cold case %s: %d requests, %d blocks computed and saved" % (sys.argv[1], c["requests"], c["computed_blocks"]))' "$c"
	i=$((i + 1))
done
keys=$("$python" -c 'import sys,urllib.request; print(urllib.request.urlopen(sys.argv[1]+"/get_all_keys",timeout=30).read().decode().count("\n"))' "http://127.0.0.1:$admin" || echo "?")
echo "pool after the cold passes: $keys keys, all in A's segment (B has not joined)"

# B joins with a segment too small to matter; its engine loads from A's segment.
serve B "$tb" "$xb" 64MiB
i=0
status=0
for c in $cases; do
	IFS=: read -r page layers batch <<<"$c"
	if ! engine "$work/B/s.sock" warm "$i" "$page" "$layers" "$batch" --stats-url "http://127.0.0.1:$xb/v1/stats" \
		>"$work/warm-$i.txt" 2>"$work/warm-$i.err"; then
		echo "run: warm pass of case $c failed:" >&2
		tail -30 "$work/warm-$i.err" >&2
		status=1
	fi
	grep '^SUMMARY ' "$work/warm-$i.txt" >"$work/warm-$i.json" || true
	echo "SUMMARY-B case=$c $(cat "$work/warm-$i.json")" | cut -c1-2000
	"$python" - "$c" "$work/warm-$i.json" <<'PY' || status=1
import json, sys
case, path = sys.argv[1], sys.argv[2]
s = json.loads(open(path).read()[len("SUMMARY "):])
w = s["warm"]
gbs = w["loaded_bytes"] / w["start_load_seconds"] / 1e9 if w["start_load_seconds"] else 0.0
line = "RESULT case=%s page=%d loaded=%d/%d blocks restarts=%d mismatched=%d warm=%.2f GB/s" % (
    case, s["page_bytes"], w["loaded_blocks"], s["expected_warm_loaded_blocks"], w["restarts"], w["mismatched_blocks"], gbs)
if "anchor" in s:
    h2d = (s["anchor"]["h2d_64mib_gbs"] + s["anchor_after"]["h2d_64mib_gbs"]) / 2
    line += " pinned-h2d=%.2f/%.2f GB/s ratio=%.3f gpu=%s" % (
        s["anchor"]["h2d_64mib_gbs"], s["anchor_after"]["h2d_64mib_gbs"], gbs / h2d, s.get("gpu", "?"))
else:
    line += " (memory %s: no pinned copy to compare with)" % s["memory"]
each = w.get("start_load_each") or []
if each:
    slow = max(each, key=lambda e: e[0])
    line += " slowest-start-load=%.2f ms (%d pages)" % (slow[0] * 1e3, slow[1])
d = s.get("daemon_loads") or {}
if d.get("transfer_seconds"):
    line += " daemon-B=%.2f GB/s" % (d["landed_bytes"] / d["transfer_seconds"] / 1e9)
line += " ok=%s" % s["ok"]
print(line)
sys.exit(0 if s["ok"] and w["loaded_blocks"] > 0 else 1)
PY
	i=$((i + 1))
done
exit "$status"
