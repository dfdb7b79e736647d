#!/bin/bash
# TensorRT-LLM shim on the GPU: V1 (cudaMalloc over CUDA IPC) and V2 (cuMemCreate over a descriptor).
R=$PWD; B=$R/.gpu-run/s3
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$R/clients/python PYTHONUNBUFFERED=1
gunzip -k -f $B/kvctl.gz $B/daemon.test.gz; chmod +x $B/kvctl $B/daemon.test
nvidia-smi -L | tee $OUT/card.txt; nvidia-smi --query-gpu=driver_version --format=csv,noheader | tee -a $OUT/card.txt
(cd clients/python && KVCTL_BIN=$B/kvctl timeout 240 python3 -m pytest -v -p no:cacheprovider tests/test_trtllm_gpu.py) > $OUT/trtllm-gpu.log 2>&1; echo "pytest rc=$?"; grep -E "PASS|FAIL|SKIP|ERROR|passed|failed|Error" $OUT/trtllm-gpu.log | tail -30
