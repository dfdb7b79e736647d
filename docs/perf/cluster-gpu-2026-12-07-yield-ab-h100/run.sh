#!/bin/bash
# A/B of the call channel's yield rate: kvctl at 56fa828 ("base") against the same with a reader
# that yields every 16 empty polls ("y16"), one cluster.test, rounds alternating the order; then
# BenchmarkAdmission with each, then CPU profiles of B (serve, no early loads) with each.
R=$PWD; B=/tmp/bins; SECONDS=0; L=$OUT/r; mkdir -p $L $OUT/prof
pack() { tar czf $OUT/logs.tgz -C $OUT r; }
{ nvidia-smi -L; nproc; uname -r; } | tee $L/card.txt
if [ ! -x $B/kvctl ]; then mkdir -p $B && xz -dc .gpu-run/p11/bins.tar.xz | tar xf - -C $B; fi
xz -dc .gpu-run/p12/new.tar.xz | tar xf - -C $B; cp $B/kvctl $B/kvctl-base
if [ ! -x /tmp/gm/mstr/mooncake_master ]; then mkdir -p /tmp/gm && tar xJf .gpu/master.tar.xz -C /tmp/gm; fi; M=/tmp/gm/mstr
mkdir -p /tmp/pyenv/bin; ln -sf "$(command -v python3)" /tmp/pyenv/bin/python3
printf '#!/bin/sh\nLD_LIBRARY_PATH=%s exec %s "$@"\n' "$M/lib" "$M/mooncake_master" > /tmp/pyenv/bin/mooncake_master; chmod +x /tmp/pyenv/bin/mooncake_master
# On an H200 the card's own figures first (as run-v17.sh): TestGPUTorchEngine twice, the check's cost.
if nvidia-smi -L | grep -q H200; then
  [ -d /tmp/site/grpc ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu-run/p7/whl/*.whl >/dev/null 2>&1 || echo "pip failed"
  for k in 1 2; do (cd core/daemon && PYTHONPATH=/tmp/site:$R/clients/python PYTHONUNBUFFERED=1 KVCTL_GPU_E2E=1 KVCTL_TORCH_REQUESTS=256 timeout 100 $B/daemon-head.test -test.run 'TestGPUTorchEngine$' -test.v > $L/torch-head-$k.log 2>&1; echo "torch $k rc=$? t=$SECONDS")
    grep -E '^--- ' $L/torch-head-$k.log; grep -oE 'StartLoad at [0-9.]+ %' $L/torch-head-$k.log | tr '\n' ' '; echo; pack
    [ $k = 1 ] && { (cd core/connector && timeout 90 $B/connector.test -test.run '^$' -test.bench 'GPUCheckCost/1024KiB/load=(12|48)MiB/leased' -test.benchtime 200x -test.count 3 > $L/checkcost-1.log 2>&1; echo "checkcost rc=$? t=$SECONDS"); grep -E '^Benchmark' $L/checkcost-1.log | sed 's/  */ /g' | cut -c1-120; pack; }
  done
fi
T=$B/cluster-new.test; cd core/cluster
ROWS='BenchmarkLoadFromPeer/^(serve|serve-async|native-get)$/^(engines=4|early|admit=8|goroutines=4)$'
peer() { KVCTL_BIN=$B/kvctl-$1 KVCTL_PYENV=/tmp/pyenv timeout 60 $T -test.run XXX -test.bench "$ROWS" -test.benchtime 40x -test.v > $L/peer-$1-$2.log 2>&1; echo "peer $1 $2 rc=$? t=$SECONDS"
  grep -E "^Benchmark.*ns/op" $L/peer-$1-$2.log | sed 's/  */ /g' | cut -c22-110; pack; }
i=1; while [ $SECONDS -lt $((${END:-240}-60)) ]; do
  if [ $((i%2)) = 1 ]; then peer base $i; peer y16 $i; else peer y16 $i; peer base $i; fi; i=$((i+1)); done
for b in base y16 base y16; do KVCTL_BIN=$B/kvctl-$b KVCTL_PYENV=/tmp/pyenv timeout 30 $T -test.run XXX -test.bench BenchmarkAdmission -test.benchtime 4000x -test.v >> $L/admission-$b.log 2>&1; echo "admission $b rc=$? t=$SECONDS"
  grep -E 'ns/op|per call' $L/admission-$b.log | tail -4 | sed 's/  */ /g' | cut -c1-200; done; pack
for b in base y16; do mkdir -p $OUT/prof/adm-$b; KVCTL_BENCH_TRACE=1 KVCTL_BENCH_PROFILE=$OUT/prof/adm-$b KVCTL_BENCH_PROFILE_SECONDS=1 KVCTL_BIN=$B/kvctl-$b KVCTL_PYENV=/tmp/pyenv timeout 30 $T -test.run XXX -test.bench BenchmarkAdmission -test.benchtime 4000x -test.v > $L/admission-traced-$b.log 2>&1; echo "admission $b rc=$? t=$SECONDS"
  grep -E 'ns/op|per call' $L/admission-traced-$b.log | sed 's/  */ /g' | cut -c1-200; done; pack
for b in base y16; do mkdir -p $OUT/prof/$b; KVCTL_BENCH_PROFILE=$OUT/prof/$b KVCTL_BENCH_PROFILE_SECONDS=2 KVCTL_BIN=$B/kvctl-$b KVCTL_PYENV=/tmp/pyenv timeout 30 $T -test.run XXX \
  -test.bench 'BenchmarkLoadFromPeer/^serve$/^engines=4$' -test.benchtime 200x -test.v > $L/prof-$b.log 2>&1; echo "prof $b rc=$? t=$SECONDS"; done
rm -f $OUT/prof/*/*-A.pprof; tar czf $OUT/prof.tgz -C $OUT prof; rm -rf $OUT/prof; pack; echo "t=$SECONDS"
