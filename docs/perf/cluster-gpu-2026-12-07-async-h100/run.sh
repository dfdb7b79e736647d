#!/bin/bash
# One device call: every row of BenchmarkLoadFromPeer, kvctl at 7cd2a00 (new: lookups answered
# from kept lists, coalesced transfers) and at bdfc5a3 (base: neither) in alternate rounds, the
# same cluster.test (7cd2a00); on an H200 also the PyTorch engine and the check's cost.
R=$PWD; B=/tmp/bins; SECONDS=0; L=$OUT/r; mkdir -p $L
pack() { tar czf $OUT/logs.tgz -C $OUT r; }
{ nvidia-smi -L; nvidia-smi --query-gpu=driver_version,pcie.link.gen.max,pcie.link.width.max --format=csv,noheader; nproc; uname -r; python3 --version; } | tee $L/card.txt
mkdir -p $B && xz -dc .gpu/bins4.tar.xz | tar xf - -C $B
mkdir -p /tmp/gc/cluster/bin && xz -dc .gpu/master.tar.xz | tar xf - -C /tmp/gc/cluster; C=/tmp/gc/cluster
mkdir -p /tmp/pyenv/bin; ln -sf "$(command -v python3)" /tmp/pyenv/bin/python3
printf '#!/bin/sh\nLD_LIBRARY_PATH=%s exec %s "$@"\n' "$C/master/lib" "$C/master/mooncake_master" > /tmp/pyenv/bin/mooncake_master; chmod +x /tmp/pyenv/bin/mooncake_master
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu/whl/*.whl >/dev/null 2>&1 || echo "pip failed"
echo "setup t=$SECONDS"
torch() { (cd core/daemon && PYTHONPATH=/tmp/site:$R/clients/python PYTHONUNBUFFERED=1 KVCTL_GPU_E2E=1 KVCTL_TORCH_REQUESTS=256 timeout 100 $B/daemon.test -test.run 'TestGPUTorchEngine$' -test.v > $L/torch-$1.log 2>&1; echo "torch $1 rc=$? t=$SECONDS")
  grep -E '^--- ' $L/torch-$1.log; grep -iE 'ratio' $L/torch-$1.log | cut -c1-200 | head -6; pack; }
checkcost() { (cd core/connector && timeout 90 $B/connector.test -test.run '^$' -test.bench 'GPUCheckCost/1024KiB/load=(12|48)MiB/leased' -test.benchtime 200x -test.count 3 > $L/checkcost-$1.log 2>&1; echo "checkcost $1 rc=$? t=$SECONDS"); grep -E '^Benchmark' $L/checkcost-$1.log | sed 's/  */ /g' | cut -c1-160; pack; }
peer() { (cd core/cluster && KVCTL_BIN=$B/kvctl-$1 KVCTL_PYENV=/tmp/pyenv timeout 85 $B/cluster.test -test.run XXX -test.bench BenchmarkLoadFromPeer -test.benchtime 40x -test.v > $L/peer-$1-$2.log 2>&1; echo "peer $1 $2 rc=$? t=$SECONDS")
  grep -E "^Benchmark.*ns/op" $L/peer-$1-$2.log | sed 's/  */ /g' | cut -c22-100; pack; }
peer new 1; peer base 1
if grep -q H200 $L/card.txt; then torch 1; checkcost 1; fi
i=2; while [ $SECONDS -lt $((${LIMIT:-300}-100)) ]; do peer new $i; peer base $i; i=$((i+1)); done
echo "end t=$SECONDS"; pack
