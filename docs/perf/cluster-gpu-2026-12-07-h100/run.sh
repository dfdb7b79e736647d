#!/bin/bash
# One device call. kvctl built at ed33111 ("base"), at a999f46 ("loc": the lookup's replica
# lists, BatchLocate; --admin-pprof) and at 7b14817 ("big": loads read straight
# into engine memory in calls of directBatchBytes); cluster.test of ca01819, daemon.test of 7b14817.
# BenchmarkLoadFromPeer (core/cluster, -benchtime 40x) big, loc, base in turn, with
# TestGPUTorchEngine (core/daemon, 256 requests) and CPU profiles (big) after the first round;
# BenchmarkAdmission loc, base (8000 admissions each) and more rounds while time is left.
R=$PWD; B=/tmp/bins; SECONDS=0
nvidia-smi -L | tee $OUT/card.txt; nvidia-smi --query-gpu=driver_version --format=csv,noheader | tee -a $OUT/card.txt; nproc | tee -a $OUT/card.txt
mkdir -p $B && xz -dc .gpu-run/p6/bins.tar.xz | tar xf - -C $B; ls $B; echo "unpacked t=$SECONDS"
mkdir -p /tmp/gm && tar xJf .gpu/master.tar.xz -C /tmp/gm; M=/tmp/gm/mstr
mkdir -p /tmp/pyenv/bin; ln -sf "$(command -v python3)" /tmp/pyenv/bin/python3
printf '#!/bin/sh\nLD_LIBRARY_PATH=%s exec %s "$@"\n' "$M/lib" "$M/mooncake_master" > /tmp/pyenv/bin/mooncake_master; chmod +x /tmp/pyenv/bin/mooncake_master
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu-run/p6/whl/*.whl >/dev/null 2>&1 || echo "pip failed"
adm() { (cd core/cluster && KVCTL_BIN=$B/kvctl-$1 KVCTL_PYENV=/tmp/pyenv timeout 60 $B/cluster.test -test.count=1 -test.run XXX -test.bench BenchmarkAdmission -test.benchtime 8000x -test.v > $OUT/admission-$1.log 2>&1; echo "admission $1 rc=$? t=$SECONDS")
  grep -E "ns/op" $OUT/admission-$1.log | sed 's/  */ /g' | cut -c1-220; }
peer() { (cd core/cluster && KVCTL_BIN=$B/kvctl-$1 KVCTL_PYENV=/tmp/pyenv timeout 100 $B/cluster.test -test.run XXX -test.bench 'BenchmarkLoadFromPeer' -test.benchtime 40x -test.v > $OUT/peer-$1-$2.log 2>&1; echo "peer $1 $2 rc=$? t=$SECONDS")
  grep -E "^Benchmark.*ns/op" $OUT/peer-$1-$2.log | sed 's/  */ /g' | cut -c1-100; }
torch() { (cd core/daemon && PYTHONPATH=/tmp/site:$R/clients/python PYTHONUNBUFFERED=1 KVCTL_GPU_E2E=1 KVCTL_TORCH_REQUESTS=256 timeout 120 $B/daemon.test -test.run 'TestGPUTorchEngine$' -test.v > $OUT/torch-$1.log 2>&1; echo "torch $1 rc=$? t=$SECONDS")
  grep -oE "ratio[^,]*|StartLoad at [0-9.]+ %" $OUT/torch-$1.log | head; grep -c "mismatched_blocks.: [1-9]" $OUT/torch-$1.log
  grep -E "^--- |^ok|FAIL" $OUT/torch-$1.log | tail -5; }
prof() { (cd core/cluster && KVCTL_BIN=$B/kvctl-big KVCTL_PYENV=/tmp/pyenv KVCTL_BENCH_PROFILE=$OUT/prof KVCTL_BENCH_PROFILE_SECONDS=3 timeout 100 $B/cluster.test -test.run XXX -test.bench "$2" -test.benchtime 200x -test.v > $OUT/peer-prof-$1.log 2>&1; echo "prof $1 rc=$? t=$SECONDS")
  grep -E "^Benchmark.*ns/op" $OUT/peer-prof-$1.log | sed 's/  */ /g' | cut -c1-100; }
peer big 1; peer loc 1
torch 1
prof async 'BenchmarkLoadFromPeer/^(serve-async|native-get)$/^(admit=2|goroutines=4)$/^(wait|batch=64)$'
ls $OUT/prof | head
peer base 1
peer big 2; peer loc 2
[ $SECONDS -lt 420 ] && prof sync 'BenchmarkLoadFromPeer/^serve$'
[ $SECONDS -lt 420 ] && peer base 2
[ $SECONDS -lt 420 ] && torch 2
[ $SECONDS -lt 440 ] && { adm loc; adm base; }
for i in 3 4; do if [ $SECONDS -lt 430 ]; then peer big $i; peer loc $i; peer base $i; fi; done
echo "t=$SECONDS"
