#!/usr/bin/env bash
# The steps of a measuring call on a GPU host without Go or network, for a run script to source
# and call in the order it wants; each step writes its log under $L and packs $L into
# $OUT/logs.tgz, so a call cut short still brings back what it finished.
#
#   BINS=.gpu/bins.tar.xz MASTER=.gpu/master.tar.xz WHEELS=.gpu/whl
#   . tools/gpucluster/steps.sh
#   setup                 # card.txt, binaries, the master, the engine's wheels
#   peer new 1            # BenchmarkLoadFromPeer, every row, with $B/kvctl-new → peer-new-1.log
#   torch 1               # TestGPUTorchEngine, 256 requests → torch-1.log
#   checkcost 1           # BenchmarkGPUCheckCost, 12 and 48 MiB of 1 MiB pages → checkcost-1.log
#   checkcost 2 lazy      # the same with connector-lazy.test → checkcost-lazy-2.log
#   cluster new 1         # tools/gpucluster/run.sh with $B/kvctl-new → cluster-new-1.log
#
# BINS is an xz tarball of test binaries built on a machine with Go (`go test -c`, CGO_ENABLED=1,
# -trimpath -ldflags '-s -w'): cluster.test, connector.test, daemon.test, kvctl-NAME for each
# kvctl build the steps name and connector-NAME.test for each connector build checkcost names;
# tools/gpucluster/bins.sh builds it, named builds from git revisions. MASTER is the master
# folder tools/gpucluster/prepare.sh makes, packed with xz; WHEELS a folder of the engine's
# wheels (grpcio, protobuf). The repository's tracked files are the working directory. FILTER
# narrows BenchmarkLoadFromPeer (two levels at most: a three-level filter leaves the two-level
# rows untimed).

R=$PWD
B=/tmp/bins
C=/tmp/gc/cluster
L=${OUT:?OUT names the folder that comes back}/r
SECONDS=0
mkdir -p "$L"

pack() { tar czf "$OUT/logs.tgz" -C "$OUT" r; }

setup() {
	{
		nvidia-smi -L
		nvidia-smi --query-gpu=driver_version,pcie.link.gen.max,pcie.link.width.max --format=csv,noheader
		nproc
		uname -r
		python3 --version
	} | tee "$L/card.txt"
	mkdir -p "$B" "$C/bin" /tmp/pyenv/bin
	xz -dc "${BINS:?}" | tar xf - -C "$B"
	xz -dc "${MASTER:?}" | tar xf - -C "$C"
	# The cluster tests start the master through KVCTL_PYENV/bin, as on a machine with `make pyenv`.
	ln -sf "$(command -v python3)" /tmp/pyenv/bin/python3
	printf '#!/bin/sh\nLD_LIBRARY_PATH=%s exec %s "$@"\n' "$C/master/lib" "$C/master/mooncake_master" >/tmp/pyenv/bin/mooncake_master
	chmod +x /tmp/pyenv/bin/mooncake_master
	python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "${WHEELS:?}"/*.whl >/dev/null 2>&1 || echo "pip failed"
	echo "setup t=$SECONDS"
}

# peer BUILD N: BenchmarkLoadFromPeer with kvctl-BUILD.
peer() {
	(cd core/cluster && KVCTL_BIN=$B/kvctl-$1 KVCTL_PYENV=/tmp/pyenv timeout 85 "$B/cluster.test" -test.run XXX \
		-test.bench "${FILTER:-BenchmarkLoadFromPeer}" -test.benchtime 40x -test.v >"$L/peer-$1-$2.log" 2>&1
	echo "peer $1 $2 rc=$? t=$SECONDS")
	grep -E '^Benchmark.*ns/op' "$L/peer-$1-$2.log" | sed 's/  */ /g' | cut -c22-100
	pack
}

# torch N: the PyTorch engine's warm loads through kvctl serve over CUDA IPC.
torch() {
	(cd core/daemon && PYTHONPATH=/tmp/site:$R/clients/python PYTHONUNBUFFERED=1 KVCTL_GPU_E2E=1 KVCTL_TORCH_REQUESTS=256 \
		timeout 100 "$B/daemon.test" -test.run 'TestGPUTorchEngine$' -test.v >"$L/torch-$1.log" 2>&1
	echo "torch $1 rc=$? t=$SECONDS")
	grep -E '^--- ' "$L/torch-$1.log"
	grep -iE 'ratio' "$L/torch-$1.log" | cut -c1-200 | head -6
	pack
}

# checkcost N [BUILD]: a checked and an unchecked load of the same pages, paired, with
# connector.test or, given BUILD, connector-BUILD.test; calls alternating two builds compare them
# on one host.
checkcost() {
	local bin=connector.test log=checkcost-$1.log
	if [ -n "$2" ]; then
		bin=connector-$2.test log=checkcost-$2-$1.log
	fi
	(cd core/connector && timeout 90 "$B/$bin" -test.run '^$' -test.bench 'GPUCheckCost/1024KiB/load=(12|48)MiB/leased' \
		-test.benchtime 200x -test.count 3 >"$L/$log" 2>&1
	echo "checkcost $1 ${2:-} rc=$? t=$SECONDS")
	grep -E '^Benchmark' "$L/$log" | sed 's/  */ /g' | cut -c1-160
	pack
}

# cluster BUILD N: the GPU-host cluster (real master, two kvctl serve, the PyTorch engine).
cluster() {
	cp "$B/kvctl-$1" "$C/bin/kvctl"
	LOGS=$L/cl-$1-$2 PYTHONPATH=/tmp/site:$R/clients/python PYTHONUNBUFFERED=1 timeout 90 bash tools/gpucluster/run.sh "$C" >"$L/cluster-$1-$2.log" 2>&1
	echo "cluster $1 $2 rc=$? t=$SECONDS"
	grep -E 'RESULT' "$L/cluster-$1-$2.log" | grep -oE 'case=[0-9:]+|warm=[0-9.]+ GB/s|ratio=[0-9.]+|slowest[^ ]*' | tr '\n' ' '
	echo
	pack
}
