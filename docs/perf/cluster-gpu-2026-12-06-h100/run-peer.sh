#!/bin/bash
# One device call: peer loads (three runs), the GPU tests of the tree, the PyTorch engine's warm
# loads (256 requests) twice.
R=$PWD; B=$R/.gpu-run/c7; SECONDS=0
true || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $B/whl/*.whl >/dev/null 2>&1 || echo "pip failed"
export PYTHONPATH=/tmp/site:$R/clients/python PYTHONUNBUFFERED=1
for f in cluster; do xz -dk -f $B/$f.test.xz; chmod +x $B/$f.test; done
nvidia-smi -L | tee $OUT/card.txt; nvidia-smi --query-gpu=driver_version --format=csv,noheader | tee -a $OUT/card.txt; nproc | tee -a $OUT/card.txt
mkdir -p /tmp/gc && tar xJf .gpu/cluster.tar.xz -C /tmp/gc; C=/tmp/gc/cluster
mkdir -p /tmp/pyenv/bin; ln -sf "$(command -v python3)" /tmp/pyenv/bin/python3
printf '#!/bin/sh\nLD_LIBRARY_PATH=%s exec %s "$@"\n' "$C/master/lib" "$C/master/mooncake_master" > /tmp/pyenv/bin/mooncake_master; chmod +x /tmp/pyenv/bin/mooncake_master
echo "== peer loads"
for i in 1 2 3; do
  (cd core/cluster && KVCTL_BIN=$C/bin/kvctl KVCTL_PYENV=/tmp/pyenv timeout 60 $B/cluster.test -test.run XXX -test.bench "BenchmarkLoadFromPeer/(serve|native-get)" -test.benchtime 40x -test.v > $OUT/peer-$i.log 2>&1; echo "peer $i rc=$?")
  grep -E "MB/s|passes \(1|phases|ns/op" $OUT/peer-$i.log | sed 's/^ *//' | cut -c1-170
done
echo "t=$SECONDS"
