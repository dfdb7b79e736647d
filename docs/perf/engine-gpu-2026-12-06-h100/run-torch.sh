#!/bin/bash
# One device call: the PyTorch engine's warm loads (256 requests), three runs.
R=$PWD; B=$R/.gpu-run/t1; SECONDS=0
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $B/whl/*.whl >/dev/null 2>&1 || echo "pip failed"
export PYTHONPATH=/tmp/site:$R/clients/python PYTHONUNBUFFERED=1
xz -dk -f $B/daemon.test.xz; chmod +x $B/daemon.test
nvidia-smi -L | tee $OUT/card.txt; nvidia-smi --query-gpu=driver_version --format=csv,noheader | tee -a $OUT/card.txt; nproc | tee -a $OUT/card.txt
for i in 1 2 3; do
echo "== torch engine, 256 requests, run $i"; (cd core/daemon && KVCTL_GPU_E2E=1 KVCTL_TORCH_REQUESTS=256 timeout $((560-SECONDS)) $B/daemon.test -test.run 'TestGPUTorchEngine$' -test.v > $OUT/torch-$i.log 2>&1; echo "rc=$?")
grep -oE "warm pass: [0-9]+ pages \([0-9]+ bytes|StartLoad at [0-9.]+ %" $OUT/torch-$i.log; grep -c "mismatched_blocks.: [1-9]" $OUT/torch-$i.log
grep -E "^--- |^ok|FAIL" $OUT/torch-$i.log | tail -3
echo "t=$SECONDS"
done
