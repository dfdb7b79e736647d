#!/bin/bash
# One device call: BenchmarkAdmission on the 16-core host; BenchmarkLoadFromPeer with the
# processes' default GOGC against GOGC=800 (the test process and both kvctl serve processes
# inherit it), alternating.
R=$PWD; B=$R/.gpu-run/p1; SECONDS=0
nvidia-smi -L | tee $OUT/card.txt; nproc | tee -a $OUT/card.txt
for f in after/kvctl after/cluster.test; do xz -dk -f $B/$f.xz; chmod +x $B/$f; done
mkdir -p /tmp/gm && tar xJf .gpu/master.tar.xz -C /tmp/gm; M=/tmp/gm/mstr
mkdir -p /tmp/pyenv/bin; ln -sf "$(command -v python3)" /tmp/pyenv/bin/python3
printf '#!/bin/sh\nLD_LIBRARY_PATH=%s exec %s "$@"\n' "$M/lib" "$M/mooncake_master" > /tmp/pyenv/bin/mooncake_master; chmod +x /tmp/pyenv/bin/mooncake_master
cd core/cluster
echo "== admission"
KVCTL_BIN=$B/after/kvctl KVCTL_PYENV=/tmp/pyenv timeout 120 $B/after/cluster.test -test.count=1 -test.run XXX -test.bench BenchmarkAdmission -test.benchtime 8000x -test.v > $OUT/admission.log 2>&1; echo "rc=$? t=$SECONDS"
grep -E "ns/op|µs|us " $OUT/admission.log | sed 's/  */ /g' | cut -c1-220 | head -20
echo "== peer loads, GOGC default vs 800"
for i in 1 2 3; do
  for g in default 800; do
    if [ $g = default ]; then unset GOGC; else export GOGC=$g; fi
    KVCTL_BIN=$B/after/kvctl KVCTL_PYENV=/tmp/pyenv timeout 120 $B/after/cluster.test -test.run XXX -test.bench 'BenchmarkLoadFromPeer' -test.benchtime 40x -test.v > $OUT/peer-gogc-$g-$i.log 2>&1; echo "peer gogc=$g $i rc=$? t=$SECONDS"
    grep -E "^Benchmark.*ns/op" $OUT/peer-gogc-$g-$i.log | sed 's/  */ /g' | cut -c1-110
    grep -E "per load" $OUT/peer-gogc-$g-$i.log | sed 's/^ *//' | cut -c1-200 | sed -n '2p;4p'
  done
  unset GOGC
  [ $SECONDS -gt 400 ] && break
done
echo "t=$SECONDS"
