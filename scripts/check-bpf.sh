#!/usr/bin/env bash
# Regenerates the eBPF objects and their Go wrappers (go generate ./ebpf)
# and fails when the result differs from what is committed, so the
# committed .o files always match the C sources. Needs clang-14,
# llvm-strip-14 and libbpf-dev (scripts/install-deps.sh); without them it
# says so and exits 0.
set -euo pipefail
cd "$(dirname "$0")/.."

for tool in clang-14 llvm-strip-14; do
	if ! command -v "$tool" >/dev/null; then
		echo "check-bpf: $tool not found; skipping the eBPF object check" >&2
		exit 0
	fi
done
if [ ! -f /usr/include/bpf/bpf_helpers.h ]; then
	echo "check-bpf: libbpf-dev headers not found; skipping the eBPF object check" >&2
	exit 0
fi

go generate ./ebpf/

generated=(ebpf/steer_bpfel.go ebpf/steer_bpfel.o ebpf/filter_bpfel.go ebpf/filter_bpfel.o ebpf/tcfault_bpfel.go ebpf/tcfault_bpfel.o)
if ! git diff --quiet --exit-code -- "${generated[@]}"; then
	echo "check-bpf: regenerated eBPF objects differ from the committed ones:" >&2
	git diff --stat -- "${generated[@]}" >&2
	echo "check-bpf: run 'go generate ./ebpf' and commit the result" >&2
	exit 1
fi
untracked=$(git ls-files --others --exclude-standard -- ebpf/ | grep -E '_bpfe[lb]\.(go|o)$' || true)
if [ -n "$untracked" ]; then
	echo "check-bpf: generated files not committed: $untracked" >&2
	exit 1
fi
# Absolute build paths must not leak into the objects.
if grep -a -q -E "$(pwd)|/usr/include" ebpf/*_bpfel.o; then
	echo "check-bpf: an object embeds an absolute path" >&2
	exit 1
fi
echo "check-bpf: eBPF objects are up to date"
