#!/bin/bash
# Short device call for the card's own figures: TestGPUTorchEngine (256 requests) head, base, head,
# BenchmarkGPUCheckCost 12/48 MiB (200x, count 3), then peer rounds while time is left.
R=$PWD; B=/tmp/bins; SECONDS=0; L=$OUT/r; mkdir -p $L
pack() { tar czf $OUT/logs.tgz -C $OUT r; }
{ nvidia-smi -L; cat /sys/kernel/mm/transparent_hugepage/enabled /sys/kernel/mm/transparent_hugepage/shmem_enabled; nvidia-smi --query-gpu=driver_version --format=csv,noheader; nproc; uname -r; } | tee $L/card.txt
if [ ! -x $B/kvctl ]; then mkdir -p $B && xz -dc .gpu-run/p11/bins.tar.xz | tar xf - -C $B; fi
if [ ! -x /tmp/gm/mstr/mooncake_master ]; then mkdir -p /tmp/gm && tar xJf .gpu/master.tar.xz -C /tmp/gm; fi; M=/tmp/gm/mstr
mkdir -p /tmp/pyenv/bin; ln -sf "$(command -v python3)" /tmp/pyenv/bin/python3
printf '#!/bin/sh\nLD_LIBRARY_PATH=%s exec %s "$@"\n' "$M/lib" "$M/mooncake_master" > /tmp/pyenv/bin/mooncake_master; chmod +x /tmp/pyenv/bin/mooncake_master
[ -d /tmp/site/grpc ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu-run/p7/whl/*.whl >/dev/null 2>&1 || echo "pip failed"
echo "setup t=$SECONDS"
torch() { (cd core/daemon && PYTHONPATH=/tmp/site:$R/clients/python PYTHONUNBUFFERED=1 KVCTL_GPU_E2E=1 KVCTL_TORCH_REQUESTS=256 timeout 100 $B/daemon-$1.test -test.run 'TestGPUTorchEngine$' -test.v > $L/torch-$1-$2.log 2>&1; echo "torch $1 $2 rc=$? t=$SECONDS")
  echo "$(grep -E '^--- ' $L/torch-$1-$2.log)"; grep -oE 'StartLoad at [0-9.]+ %' $L/torch-$1-$2.log | tr '\n' ' '; echo; pack; }
peer() { (cd core/cluster && KVCTL_BIN=$B/kvctl KVCTL_PYENV=/tmp/pyenv timeout 120 $B/cluster.test -test.run XXX -test.bench BenchmarkLoadFromPeer -test.benchtime 40x -test.v > $L/peer-$1.log 2>&1; echo "peer $1 rc=$? t=$SECONDS")
  grep -E "^Benchmark.*(serve/early/engines|native-get/goroutines=4/batch=64).*ns/op" $L/peer-$1.log | sed 's/  */ /g' | cut -c1-110; pack; }
checkcost() { (cd core/connector && timeout 90 $B/connector.test -test.run '^$' -test.bench 'GPUCheckCost/1024KiB/load=(12|48)MiB/leased' -test.benchtime 200x -test.count 3 > $L/checkcost-$1.log 2>&1; echo "checkcost $1 rc=$? t=$SECONDS"); grep -E '^Benchmark' $L/checkcost-$1.log | sed 's/  */ /g' | cut -c1-120; pack; }
torch head 1; checkcost 1; torch head 2
i=1; while [ $SECONDS -lt $((${END:-240}-25-${PROF:-70})) ]; do peer $i; i=$((i+1)); done
echo "t=$SECONDS"; pack
if [ "${PROF:-70}" -gt 0 ]; then mkdir -p $OUT/prof; cd core/cluster
  KVCTL_BIN=$B/kvctl KVCTL_PYENV=/tmp/pyenv timeout 40 $B/cluster.test -test.run XXX -test.bench BenchmarkAdmission -test.benchtime 4000x -test.v > $L/admission-1.log 2>&1; echo "admission rc=$? t=$SECONDS"
  grep -E 'ns/op|per call' $L/admission-1.log | sed 's/  */ /g' | cut -c1-220
  KVCTL_BENCH_PROFILE=$OUT/prof KVCTL_BENCH_PROFILE_SECONDS=2 KVCTL_BIN=$B/kvctl KVCTL_PYENV=/tmp/pyenv timeout 60 $B/cluster.test -test.run XXX \
    -test.bench 'BenchmarkLoadFromPeer/^(serve|native-get)$/^(engines=4|early|goroutines=4)$' -test.benchtime 200x -test.v > $L/prof.log 2>&1; echo "prof rc=$? t=$SECONDS"
  grep -E "^Benchmark.*ns/op" $L/prof.log | sed 's/  */ /g' | cut -c1-160
  tar czf $OUT/prof.tgz -C $OUT prof; pack; fi
