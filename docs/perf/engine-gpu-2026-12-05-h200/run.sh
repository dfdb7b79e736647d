#!/bin/bash
# GPU checks of the engine SDK, the reference engine and stream ordering, run from the repo root.
R=$PWD; B=$R/.gpu-run/all
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$R/clients/python PYTHONUNBUFFERED=1
gunzip -k -f $B/kvctl.gz $B/daemon.test.gz; chmod +x $B/kvctl $B/daemon.test
nvidia-smi -L | tee $OUT/card.txt; python3 -c 'import torch,transformers,grpc,google.protobuf as p;print(torch.__version__,transformers.__version__,grpc.__version__,p.__version__)' | tee -a $OUT/card.txt
echo "== daemon GPU tests"
(cd core/daemon && KVCTL_GPU_E2E=1 timeout 180 $B/daemon.test -test.run 'TestGPUTorchEngine$|TestGPUStreamOrdering' -test.v -test.count=1 -test.timeout 175s) > $OUT/daemon-gpu.log 2>&1; echo "daemon rc=$?"; grep -E "^(--- |ok|FAIL|PASS)|summary" $OUT/daemon-gpu.log | cut -c1-400
echo "== hf proofs on cuda"
(cd clients/python && KVCTL_BIN=$B/kvctl timeout 200 python3 -m pytest -v -p no:cacheprovider tests/test_hf_proof.py tests/test_hf_tp.py tests/test_trtllm_gpu.py --device cuda) > $OUT/hf-cuda.log 2>&1; echo "hf rc=$?"; grep -E "PASS|FAIL|SKIP|ERROR|passed|failed" $OUT/hf-cuda.log | tail -30
echo "== ttft"
mkdir -p /tmp/tt && chmod 700 /tmp/tt
$B/kvctl serve --socket /tmp/tt/s.sock --pool-size 24GiB --admin-addr 127.0.0.1:0 > $OUT/ttft-serve.log 2>&1 &
for i in $(seq 50); do [ -S /tmp/tt/s.sock ] && break; sleep 0.2; done
timeout 140 python3 -m kvctl_engine.hf bench-ttft --device cuda --socket /tmp/tt/s.sock --prompt-tokens 4096,16384 --reps 3 > $OUT/ttft.json 2> $OUT/ttft.err; echo "ttft rc=$?"; cat $OUT/ttft.json; tail -5 $OUT/ttft.err
kill %1
