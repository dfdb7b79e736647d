#!/bin/bash
# GPU checks after the stream-ordering and dummy/drafter changes, run from the repo root.
R=$PWD; B=$R/.gpu-run/all
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$R/clients/python PYTHONUNBUFFERED=1
gunzip -k -f $B/kvctl.gz $B/daemon.test.gz; chmod +x $B/kvctl $B/daemon.test
nvidia-smi -L | tee $OUT/card.txt; git -C $R log --oneline -1 2>/dev/null | tee -a $OUT/card.txt
echo "== TensorRT-LLM shim, V1 pool, and the reference engine's proofs on cuda"
(cd clients/python && KVCTL_BIN=$B/kvctl timeout 200 python3 -m pytest -v -p no:cacheprovider tests/test_trtllm_gpu.py tests/test_hf_proof.py --device cuda) > $OUT/hf-cuda.log 2>&1; echo "pytest rc=$?"; grep -E "PASS|FAIL|SKIP|ERROR|passed|failed" $OUT/hf-cuda.log | tail -20
echo "== daemon GPU tests"
(cd core/daemon && KVCTL_GPU_E2E=1 timeout 150 $B/daemon.test -test.run 'TestGPUTorchEngine$|TestGPUStreamOrdering' -test.v -test.count=1 -test.timeout 145s) > $OUT/daemon-gpu.log 2>&1; echo "daemon rc=$?"; grep -E "^(--- |ok|FAIL|PASS)|StartLoad at" $OUT/daemon-gpu.log | sed -e 's/.*pinned H2D/pinned H2D/' | cut -c1-200
