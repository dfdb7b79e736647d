#!/bin/bash
# One device call: the split GPU path's tests, the GPU-host cluster, peer loads, warm 64 KiB loads.
R=$PWD; B=$R/.gpu-run/c2; SECONDS=0
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $B/whl/*.whl >/dev/null 2>&1 || echo "pip failed"
export PYTHONPATH=/tmp/site:$R/clients/python PYTHONUNBUFFERED=1
for f in gpu connector daemon cluster; do xz -dk -f $B/$f.test.xz; chmod +x $B/$f.test; done
nvidia-smi -L | tee $OUT/card.txt; nvidia-smi --query-gpu=driver_version --format=csv,noheader | tee -a $OUT/card.txt; nproc | tee -a $OUT/card.txt
echo "== gpu tests"; (cd gpu && timeout 120 $B/gpu.test -test.v > $OUT/gpu-tests.log 2>&1; echo "gpu.test rc=$?"); grep -cE "^--- PASS" $OUT/gpu-tests.log; grep -E "^--- FAIL|^FAIL|panic" $OUT/gpu-tests.log | head
echo "== connector GPU tests"; (cd core/connector && timeout 120 $B/connector.test -test.run 'GPU|Wake|HostChecked|IssuedBatch|CUDA' -test.v > $OUT/connector-gpu.log 2>&1; echo "connector.test rc=$?"); grep -cE "^--- PASS" $OUT/connector-gpu.log; grep -E "^--- FAIL|^FAIL|^--- SKIP|panic" $OUT/connector-gpu.log | head
echo "t=$SECONDS"
mkdir -p /tmp/gc && tar xJf .gpu/cluster.tar.xz -C /tmp/gc; C=/tmp/gc/cluster
echo "== cluster"; timeout 200 bash tools/gpucluster/run.sh $C > $OUT/cluster.log 2>&1; echo "cluster rc=$?"; grep -E "RESULT|rror" $OUT/cluster.log | tail -20
echo "t=$SECONDS"
echo "== peer loads"
mkdir -p /tmp/pyenv/bin; ln -sf "$(command -v python3)" /tmp/pyenv/bin/python3
printf '#!/bin/sh\nLD_LIBRARY_PATH=%s exec %s "$@"\n' "$C/master/lib" "$C/master/mooncake_master" > /tmp/pyenv/bin/mooncake_master; chmod +x /tmp/pyenv/bin/mooncake_master
for i in 1 2; do (cd core/cluster && KVCTL_BIN=$C/bin/kvctl KVCTL_PYENV=/tmp/pyenv timeout 100 $B/cluster.test -test.run XXX -test.bench BenchmarkLoadFromPeer -test.benchtime 5x -test.v > $OUT/peer-$i.log 2>&1; echo "peer run $i rc=$?"); grep -E "^Benchmark|ratio" $OUT/peer-$i.log | tail -3; done
echo "t=$SECONDS"
echo "== torch engine, 256 requests"; (cd core/daemon && KVCTL_GPU_E2E=1 KVCTL_TORCH_REQUESTS=256 timeout $((540-SECONDS)) $B/daemon.test -test.run 'TestGPUTorchEngine$' -test.v > $OUT/torch.log 2>&1; echo "rc=$?"); grep -E "ratio|mismatch|^--- |^ok|FAIL" $OUT/torch.log | tail -12
echo "t=$SECONDS"
