#!/bin/bash
# One device call: BenchmarkLoadFromPeer with the engines' GetFinished wait (serve-async/wait,
# serve-async/admit=2/wait) beside the polling cases, three runs; then, on an H200 with time
# left, one TestGPUTorchEngine run (256 requests, the tree before the wait).
R=$PWD; B=$R/.gpu-run/p4; SECONDS=0
nvidia-smi -L | tee $OUT/card.txt; nvidia-smi --query-gpu=driver_version --format=csv,noheader | tee -a $OUT/card.txt; nproc | tee -a $OUT/card.txt
for f in kvctl cluster.test; do xz -dk -f $B/$f.xz; chmod +x $B/$f; done
mkdir -p /tmp/gm && tar xJf .gpu/master.tar.xz -C /tmp/gm; M=/tmp/gm/mstr
mkdir -p /tmp/pyenv/bin; ln -sf "$(command -v python3)" /tmp/pyenv/bin/python3
printf '#!/bin/sh\nLD_LIBRARY_PATH=%s exec %s "$@"\n' "$M/lib" "$M/mooncake_master" > /tmp/pyenv/bin/mooncake_master; chmod +x /tmp/pyenv/bin/mooncake_master
for i in 1 2 3; do
  (cd core/cluster && KVCTL_BIN=$B/kvctl KVCTL_PYENV=/tmp/pyenv timeout 150 $B/cluster.test -test.run XXX -test.bench 'BenchmarkLoadFromPeer' -test.benchtime 40x -test.v > $OUT/peer-wait-$i.log 2>&1; echo "peer $i rc=$? t=$SECONDS")
  grep -E "^Benchmark.*ns/op" $OUT/peer-wait-$i.log | sed 's/  */ /g' | cut -c1-110
  grep -E "engine passes|per load" $OUT/peer-wait-$i.log | sed 's/^ *//' | cut -c1-200 | sed -n '12p;14p;16p;18p'
done
echo "t=$SECONDS"
if grep -q H200 $OUT/card.txt && [ $SECONDS -lt 300 ]; then
  xz -dk -f $B/daemon.test.xz; chmod +x $B/daemon.test
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $B/whl/*.whl >/dev/null 2>&1 || echo "pip failed"
  export PYTHONPATH=/tmp/site:$R/clients/python PYTHONUNBUFFERED=1
  echo "== torch engine, 256 requests"; (cd core/daemon && KVCTL_GPU_E2E=1 KVCTL_TORCH_REQUESTS=256 timeout $((570-SECONDS)) $B/daemon.test -test.run 'TestGPUTorchEngine$' -test.v > $OUT/torch-1.log 2>&1; echo "rc=$?")
  grep -oE "ratio[^,]*|StartLoad at [0-9.]+ %" $OUT/torch-1.log | head; grep -c "mismatched_blocks.: [1-9]" $OUT/torch-1.log
  grep -E "^--- |^ok|FAIL" $OUT/torch-1.log | tail -5
fi
echo "t=$SECONDS"
