#!/usr/bin/env bash
# Builds the BINS tarball tools/gpucluster/steps.sh unpacks on a GPU host without Go: test
# binaries of the working tree, kvctl-new from it, and for each NAME=REV given, kvctl-NAME,
# connector-NAME.test and gpu-NAME.test built from git revision REV (a commit or branch), so one
# device call can compare builds (`peer NAME N`, `cluster NAME N`, `checkcost N NAME`).
#
#   tools/gpucluster/bins.sh .gpu/bins.tar.xz                  # this tree only
#   tools/gpucluster/bins.sh .gpu/bins.tar.xz base=bdfc5a3 lazy=gputime-lazy
#
# TESTS names the working tree's test packages to build (default: cluster connector daemon gpu,
# from core/cluster, core/connector, core/daemon and gpu). Everything is built with cgo (the CUDA
# backend), stripped, and packed with xz; a device call carries at most 64 MiB in all, the
# repository's tracked files and the master folder included, so it warns above 24 MiB.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:?usage: bins.sh OUT.tar.xz [NAME=REV ...]}
shift
for spec in "$@"; do
	if [[ ! "$spec" =~ ^[A-Za-z0-9_-]+=[^=]+$ ]]; then
		echo "bins: $spec is not NAME=REV (NAME of letters, digits, - or _)" >&2
		exit 2
	fi
	git rev-parse --verify -q "${spec#*=}^{commit}" >/dev/null || {
		echo "bins: ${spec#*=} is not a commit here" >&2
		exit 2
	}
done
export CGO_ENABLED=1 CGO_CFLAGS=-Wno-deprecated-declarations
flags=(-trimpath -ldflags '-s -w')
stage=$(mktemp -d)
trees=()
cleanup() {
	for t in "${trees[@]}"; do git worktree remove --force "$t" >/dev/null 2>&1 || true; done
	rm -rf "$stage"
}
trap cleanup EXIT

pkgdir() {
	case $1 in
	gpu) echo gpu ;;
	*) echo "core/$1" ;;
	esac
}

for t in ${TESTS:-cluster connector daemon gpu}; do
	go test -c "${flags[@]}" -o "$stage/$t.test" "./$(pkgdir "$t")"
done
go build "${flags[@]}" -o "$stage/kvctl-new" ./cmd/kvctl

for spec in "$@"; do
	name=${spec%%=*} rev=${spec#*=}
	tree=$stage/tree-$name
	git worktree add -q --detach "$tree" "$rev"
	trees+=("$tree")
	(cd "$tree" && go build "${flags[@]}" -o "$stage/kvctl-$name" ./cmd/kvctl &&
		go test -c "${flags[@]}" -o "$stage/connector-$name.test" ./core/connector &&
		go test -c "${flags[@]}" -o "$stage/gpu-$name.test" ./gpu)
done

mkdir -p "$(dirname "$out")"
tar cf - -C "$stage" --exclude 'tree-*' . | xz -9 -T0 >"$out"
size=$(stat -c %s "$out")
echo "bins: $out, $((size >> 20)) MiB:"
tar tJf "$out" | grep -v '^\./$' | sed 's|^\./|  |'
if ((size > 24 << 20)); then
	echo "bins: over 24 MiB; with the master folder and the tree a call may pass its 64 MiB (TESTS= builds fewer)" >&2
fi
