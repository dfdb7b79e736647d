#!/bin/sh
# syslibs.sh PYENV: makes the shared libraries that the Mooncake wheel's binaries link against
# (mooncake_master, store.so, engine.so: libibverbs, librdmacm, libnuma and what they need)
# loadable for the tests without installing anything on the system. When ldd finds one missing,
# it downloads Debian's packages for them (`apt-get download`, which needs no root) and unpacks
# their libraries into PYENV/syslib/lib; the Makefile and the test harness
# (mooncake/mooncaketest) put that folder on LD_LIBRARY_PATH. Where that cannot be done it says
# so and exits 0: the Mooncake tests then skip on a developer machine and fail under CI=true
# (.ci/run installs the same packages with apt-get install).
set -eu
env=$1
lib=$env/syslib/lib
pkgs="libibverbs1 librdmacm1 libnuma1 libnl-3-200 libnl-route-3-200"

missing() {
	for f in "$env"/lib/python3*/site-packages/mooncake/mooncake_master \
		"$env"/lib/python3*/site-packages/mooncake/*.so; do
		[ -f "$f" ] || continue
		LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" ldd "$f" 2>/dev/null | awk '/not found/ {print $1}'
	done | sort -u
}

need=$(missing)
[ -z "$need" ] && exit 0
echo "== $(echo $need | tr '\n' ' ')not on this system: unpacking Debian's $pkgs into $lib"
if ! command -v apt-get >/dev/null || ! command -v dpkg-deb >/dev/null; then
	echo "syslibs: no apt-get or dpkg-deb; install $pkgs (or your system's packages for $need)"
	exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if ! (cd "$tmp" && apt-get download -qq $pkgs >/dev/null 2>&1); then
	echo "syslibs: apt-get download $pkgs failed (no package lists? run apt-get update as root, or install them)"
	exit 0
fi
mkdir -p "$lib"
for deb in "$tmp"/*.deb; do
	dpkg-deb -x "$deb" "$tmp/root"
done
find "$tmp/root" -name '*.so*' \( -type f -o -type l \) -exec cp -P {} "$lib/" \;
need=$(missing)
if [ -n "$need" ]; then
	echo "syslibs: still missing $(echo $need | tr '\n' ' ')"
fi
exit 0
