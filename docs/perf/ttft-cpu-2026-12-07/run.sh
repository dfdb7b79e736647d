#!/bin/bash
# usage: run.sh <kvctl binary> <label>; one kvctl serve on the embedded pool, one bench-ttft on CPU.
mkdir -p /tmp/ttft; BIN=$1; L=$2; D=$(mktemp -d /tmp/ttft/s.XXXX)
$BIN serve --socket $D/kvctl.sock --admin-addr "" --pool-size 2GiB > $D/serve.log 2>&1 &
SP=$!
for i in $(seq 50); do [ -S $D/kvctl.sock ] && break; sleep 0.1; done
cd "$(git rev-parse --show-toplevel)" && PYTHONPATH=clients/python timeout 600 .cache/engineenv/bin/python -m kvctl_engine.hf bench-ttft \
  --socket $D/kvctl.sock --device cpu --prompt-tokens 4096 --reps 5 \
  --layers 8 --hidden 512 --heads 8 --kv-heads 8 > /tmp/ttft/$L.json 2> /tmp/ttft/$L.err
echo "$L rc=$?"
kill $SP; wait $SP 2>/dev/null
