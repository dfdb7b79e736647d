#!/bin/bash
# One device call. kvctl, cluster.test and daemon.test built at 1f6acaf (early loads).
# BenchmarkLoadFromPeer (core/cluster, -benchtime 40x, every row) in rounds, with
# TestGPUTorchEngine (core/daemon, 256 requests) after the first and third rounds.
R=$PWD; B=/tmp/bins; SECONDS=0; L=$OUT/r; mkdir -p $L
pack() { tar czf $OUT/logs.tgz -C $OUT r; }
{ nvidia-smi -L; nvidia-smi --query-gpu=driver_version --format=csv,noheader; nproc; } | tee $L/card.txt
mkdir -p $B && xz -dc .gpu-run/p7/bins.tar.xz | tar xf - -C $B; ls $B; echo "unpacked t=$SECONDS"
mkdir -p /tmp/gm && tar xJf .gpu/master.tar.xz -C /tmp/gm; M=/tmp/gm/mstr
mkdir -p /tmp/pyenv/bin; ln -sf "$(command -v python3)" /tmp/pyenv/bin/python3
printf '#!/bin/sh\nLD_LIBRARY_PATH=%s exec %s "$@"\n' "$M/lib" "$M/mooncake_master" > /tmp/pyenv/bin/mooncake_master; chmod +x /tmp/pyenv/bin/mooncake_master
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu-run/p7/whl/*.whl >/dev/null 2>&1 || echo "pip failed"
peer() { (cd core/cluster && KVCTL_BIN=$B/kvctl KVCTL_PYENV=/tmp/pyenv timeout 150 $B/cluster.test -test.run XXX -test.bench BenchmarkLoadFromPeer -test.benchtime 40x -test.v > $L/peer-$1.log 2>&1; echo "peer $1 rc=$? t=$SECONDS")
  grep -E "^Benchmark.*ns/op" $L/peer-$1.log | sed 's/  */ /g' | cut -c1-100; pack; }
torch() { (cd core/daemon && PYTHONPATH=/tmp/site:$R/clients/python PYTHONUNBUFFERED=1 KVCTL_GPU_E2E=1 KVCTL_TORCH_REQUESTS=256 timeout 150 $B/daemon.test -test.run 'TestGPUTorchEngine$' -test.v > $L/torch-$1.log 2>&1; echo "torch $1 rc=$? t=$SECONDS")
  grep -oE "ratio[^,]*|StartLoad at [0-9.]+ %" $L/torch-$1.log | head; grep -E "^--- |^ok|FAIL" $L/torch-$1.log | tail -5; pack; }
peer 1
torch 1
peer 2
[ $SECONDS -lt 300 ] && peer 3
for i in 4 5; do [ $SECONDS -lt 330 ] && peer $i; done
echo "t=$SECONDS"; pack
