#!/usr/bin/env bash
# Prepares the carry folder for tools/gpucluster/run.sh on a machine with Go and the Python
# environment of `make pyenv` (KVCTL_PYENV): a host with no Go and no network then runs the
# cluster from the folder and the repository's tracked files alone.
#
#   tools/gpucluster/prepare.sh [CARRY]      # CARRY defaults to .gpu/cluster
#
# It also packs the folder into CARRY.tar.gz (about 40 MB), which is what travels: the folder
# itself is larger than what a device run carries (64 MiB).
#
# CARRY/bin/kvctl             kvctl, built with cgo (the CUDA backend)
# CARRY/master/mooncake_master  the real master, out of the pinned wheel
# CARRY/master/lib/           every shared library the master loads that is not the C library
#                             itself: the wheel's own (mooncake_transfer_engine_non_cuda.libs),
#                             the ones `make pyenv` unpacked (syslib/lib: libibverbs, libnuma,
#                             librdmacm, libnl) and the system's (libcurl and what it needs)
# CARRY/MANIFEST              what was copied from where, and the sums
set -euo pipefail
cd "$(dirname "$0")/../.."
carry=${1:-.gpu/cluster}
pyenv=${KVCTL_PYENV:-.cache/pyenv}
master=$(ls "$pyenv"/lib/python3*/site-packages/mooncake/mooncake_master 2>/dev/null | head -1 || true)
if [[ -z "$master" ]]; then
	echo "prepare: no mooncake_master under $pyenv (run make pyenv, or set KVCTL_PYENV)" >&2
	exit 2
fi
rm -rf "$carry"
mkdir -p "$carry/bin" "$carry/master/lib"
CGO_ENABLED=1 CGO_CFLAGS=-Wno-deprecated-declarations go build -trimpath -ldflags '-s -w' -o "$carry/bin/kvctl" ./cmd/kvctl
cp "$master" "$carry/master/mooncake_master"
chmod +x "$carry/master/mooncake_master"

# The libraries the master resolves here, with the wheel's and pyenv's libraries found the way
# the test harness finds them. The C library's own parts stay the host's: they must match its
# dynamic loader.
libpath="$pyenv/syslib/lib:$(dirname "$master")/../mooncake_transfer_engine_non_cuda.libs"
glibc='^(linux-vdso|ld-linux|libc|libm|libpthread|libdl|librt|libresolv|libutil)\.so'
LD_LIBRARY_PATH="$libpath${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" ldd "$master" >"$carry/master/ldd.txt"
if grep -q 'not found' "$carry/master/ldd.txt"; then
	echo "prepare: the master misses libraries here:" >&2
	grep 'not found' "$carry/master/ldd.txt" >&2
	exit 2
fi
{
	echo "mooncake_master  $master"
	while read -r name arrow path _; do
		[[ "$arrow" == "=>" && -f "$path" ]] || continue
		[[ "$name" =~ $glibc ]] && continue
		cp -L "$path" "$carry/master/lib/$name"
		echo "$name  $path"
	done <"$carry/master/ldd.txt"
	echo
	(cd "$carry" && sha256sum bin/kvctl master/mooncake_master master/lib/*)
} >"$carry/MANIFEST"
tar czf "$carry.tar.gz" -C "$(dirname "$carry")" "$(basename "$carry")"
echo "prepare: $carry.tar.gz ($(du -h "$carry.tar.gz" | cut -f1)): kvctl, mooncake_master and $(ls "$carry/master/lib" | wc -l) libraries"
