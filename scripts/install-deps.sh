#!/usr/bin/env bash
# Installs the Debian packages the tests use. Safe to run again: it only
# installs what is missing. Needs root (CI runs as root); without root it
# says what is missing and exits 0, and the tests that need those tools skip.
set -euo pipefail

pkgs=(
	tshark      # independent RoCE v2 decoder for golden-frame tests
	gcc         # compiles the C ABI layout test and the C example client
	clang llvm  # regenerates the eBPF objects (ci checks they match)
	libbpf-dev  # bpf_helpers.h for the eBPF C sources
	iproute2    # ip netns / bridge / tuntap for the TAP integration tests
)

missing=()
for p in "${pkgs[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -ne 0 ]; then
	echo "install-deps: not root; missing packages: ${missing[*]} (tests that need them will skip)" >&2
	exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install-deps: installed ${missing[*]}"
