#!/bin/bash
# One device call: the GPU-host cluster with kvctl at 7cd2a00 ("new": lookups answered from kept
# replica lists, coalesced reads and writes), at ae1de91 ("coal": coalesced only) and at bdfc5a3
# ("base": neither), alternated, logs kept; on an H200 the PyTorch engine and the check's cost;
# gets by transfers bound and coalescing; coalesced puts; peer rounds alternated over the builds.
R=$PWD; B=/tmp/bins; SECONDS=0; L=$OUT/r; mkdir -p $L
pack() { tar czf $OUT/logs.tgz -C $OUT r; }
{ nvidia-smi -L; nvidia-smi --query-gpu=driver_version,pcie.link.gen.max,pcie.link.width.max --format=csv,noheader; nproc; uname -r; python3 --version; } | tee $L/card.txt
mkdir -p $B && xz -dc .gpu/bins4.tar.xz | tar xf - -C $B
mkdir -p /tmp/gc/cluster/bin && xz -dc .gpu/master.tar.xz | tar xf - -C /tmp/gc/cluster; C=/tmp/gc/cluster
mkdir -p /tmp/pyenv/bin; ln -sf "$(command -v python3)" /tmp/pyenv/bin/python3
printf '#!/bin/sh\nLD_LIBRARY_PATH=%s exec %s "$@"\n' "$C/master/lib" "$C/master/mooncake_master" > /tmp/pyenv/bin/mooncake_master; chmod +x /tmp/pyenv/bin/mooncake_master
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu/whl/*.whl >/dev/null 2>&1 || echo "pip failed"
echo "setup t=$SECONDS"
cl() { cp $B/kvctl-$1 $C/bin/kvctl; LOGS=$L/cl-$1-$2 PYTHONPATH=/tmp/site:$R/clients/python PYTHONUNBUFFERED=1 timeout 90 bash tools/gpucluster/run.sh $C > $L/cluster-$1-$2.log 2>&1; echo "cluster $1 $2 rc=$? t=$SECONDS"
  grep -E 'RESULT' $L/cluster-$1-$2.log | grep -oE 'case=[0-9:]+|warm=[0-9.]+ GB/s|ratio=[0-9.]+|slowest[^ ]*' | tr '\n' ' '; echo; pack; }
peer() { (cd core/cluster && KVCTL_BIN=$B/kvctl-$1 KVCTL_PYENV=/tmp/pyenv timeout 60 $B/cluster.test -test.run XXX -test.bench 'BenchmarkLoadFromPeer/^(serve|native-get)$/^(engines=4|early|goroutines=4)$' -test.benchtime 40x -test.v > $L/peer-$1-$2.log 2>&1; echo "peer $1 $2 rc=$? t=$SECONDS")
  grep -E "^Benchmark.*ns/op" $L/peer-$1-$2.log | sed 's/  */ /g' | cut -c1-110; pack; }
peer new 0; peer coal 0; peer base 0
cl new 1; cl coal 1
torch() { (cd core/daemon && PYTHONPATH=/tmp/site:$R/clients/python PYTHONUNBUFFERED=1 KVCTL_GPU_E2E=1 KVCTL_TORCH_REQUESTS=256 timeout 100 $B/daemon.test -test.run 'TestGPUTorchEngine$' -test.v > $L/torch-$1.log 2>&1; echo "torch $1 rc=$? t=$SECONDS")
  grep -E '^--- ' $L/torch-$1.log; grep -iE 'ratio' $L/torch-$1.log | cut -c1-200 | head -6; pack; }
checkcost() { (cd core/connector && timeout 90 $B/connector.test -test.run '^$' -test.bench 'GPUCheckCost/1024KiB/load=(12|48)MiB/leased' -test.benchtime 200x -test.count 3 > $L/checkcost-$1.log 2>&1; echo "checkcost $1 rc=$? t=$SECONDS"); grep -E '^Benchmark' $L/checkcost-$1.log | sed 's/  */ /g' | cut -c1-160; pack; }
if grep -q H200 $L/card.txt; then torch 1; checkcost 1; fi
[ $SECONDS -lt $((${LIMIT:-600}-60)) ] && (cd mooncake && KVCTL_PYENV=/tmp/pyenv timeout $((${LIMIT:-600}-SECONDS-25)) $B/mooncake.test -test.run '^$' -test.bench BenchmarkNativeGetTransfers/page=64KiB -test.benchtime 10x -test.count 1 > $L/transfers-1.log 2>&1; echo "transfers rc=$? t=$SECONDS")
grep -E '^Benchmark' $L/transfers-1.log | sed 's/  */ /g' | cut -c30-150; pack
[ $SECONDS -lt $((${LIMIT:-600}-30)) ] && (cd mooncake && KVCTL_PYENV=/tmp/pyenv timeout 25 $B/mooncake.test -test.run "^$" -test.bench BenchmarkNativePutCoalesced -test.benchtime 20x -test.count 2 > $L/puts-1.log 2>&1; echo "puts rc=$? t=$SECONDS"); grep -E "^Benchmark" $L/puts-1.log | sed "s/  */ /g" | cut -c28-150; pack
i=1; while [ $SECONDS -lt ${END:-500} ]; do peer new $i; peer coal $i; peer base $i; i=$((i+1)); done
[ $SECONDS -lt $((${LIMIT:-600}-90)) ] && cl base 1
echo "end t=$SECONDS"; pack
