#!/bin/bash
# One device call: BenchmarkLoadFromPeer with the current kvctl ("after") and the one before the
# asynchronous load workers stopped pinning their thread ("before", eb7a6b5), alternating, on the
# same cluster.test; then, on an H200 with time left, one TestGPUTorchEngine run (256 requests).
R=$PWD; B=$R/.gpu-run/p1; SECONDS=0
nvidia-smi -L | tee $OUT/card.txt; nvidia-smi --query-gpu=driver_version --format=csv,noheader | tee -a $OUT/card.txt; nproc | tee -a $OUT/card.txt
for f in after/kvctl after/cluster.test after/daemon.test before/kvctl; do xz -dk -f $B/$f.xz; chmod +x $B/$f; done
mkdir -p /tmp/gm && tar xJf .gpu/master.tar.xz -C /tmp/gm; M=/tmp/gm/mstr
mkdir -p /tmp/pyenv/bin; ln -sf "$(command -v python3)" /tmp/pyenv/bin/python3
printf '#!/bin/sh\nLD_LIBRARY_PATH=%s exec %s "$@"\n' "$M/lib" "$M/mooncake_master" > /tmp/pyenv/bin/mooncake_master; chmod +x /tmp/pyenv/bin/mooncake_master
/tmp/pyenv/bin/mooncake_master --help >/dev/null 2>&1; echo "master runs: rc=$?"
echo "== peer loads"
for i in 1 2 3; do
  for which in after before; do
    (cd core/cluster && KVCTL_BIN=$B/$which/kvctl KVCTL_PYENV=/tmp/pyenv timeout 120 $B/after/cluster.test -test.run XXX -test.bench 'BenchmarkLoadFromPeer' -test.benchtime 40x -test.v > $OUT/peer-$which-$i.log 2>&1; echo "peer $which $i rc=$? t=$SECONDS")
    grep -E "^Benchmark.*ns/op" $OUT/peer-$which-$i.log | sed 's/  */ /g' | cut -c1-150
  done
  [ $SECONDS -gt 330 ] && break
done
echo "t=$SECONDS"
if grep -q H200 $OUT/card.txt && [ $SECONDS -lt 380 ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $B/whl/*.whl >/dev/null 2>&1 || echo "pip failed"
  export PYTHONPATH=/tmp/site:$R/clients/python PYTHONUNBUFFERED=1
  echo "== torch engine, 256 requests"; (cd core/daemon && KVCTL_GPU_E2E=1 KVCTL_TORCH_REQUESTS=256 timeout $((560-SECONDS)) $B/after/daemon.test -test.run 'TestGPUTorchEngine$' -test.v > $OUT/torch-1.log 2>&1; echo "rc=$?")
  grep -oE "warm pass: [0-9]+ pages \([0-9]+ bytes|StartLoad at [0-9.]+ %|ratio[^,]*" $OUT/torch-1.log | head; grep -c "mismatched_blocks.: [1-9]" $OUT/torch-1.log
  grep -E "^--- |^ok|FAIL" $OUT/torch-1.log | tail -5
fi
echo "t=$SECONDS"
