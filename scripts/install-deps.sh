#!/usr/bin/env bash
# Installs the Debian packages the tests use, and mounts tracefs where it
# is not. Safe to run again: it only installs what is missing. Needs root
# (CI runs as root); without root it says what is missing and exits 0, and
# the tests that need those tools skip (under CI=true they fail instead:
# see internal/testenv). As root, a failed
# installation, or a package still missing afterwards, exits non-zero.
set -euo pipefail

pkgs=(
	tshark      # independent RoCE v2 decoder for golden-frame tests and the CNP (tests/dataplane/cnp_test.go)
	gcc         # compiles the C ABI layout test and the C example client
	clang llvm  # regenerates the eBPF objects (ci checks they match)
	libbpf-dev  # bpf_helpers.h for the eBPF C sources
	iproute2    # ip netns / bridge / tuntap for the TAP integration tests; ss and ip for the congestion scenario (tests/congestion)
	iputils-ping # ping with a TTL: tests/routed checks each path's routers
	ibverbs-utils   # ibv_devices, ibv_devinfo, ibv_*_pingpong: run through vrnic-run by tests/ibverbs
	perftest        # ib_write_bw and friends: the extended verbs path through vrnic-run
	rdmacm-utils    # rping, ucmatose: the rdma_cm programs a future librdmacm must run
	libibverbs-dev  # <infiniband/verbs.h> and libibverbs.so.1, which vrnic's libibverbs is built against
	librdmacm-dev   # <rdma/rdma_cma.h>, for the future librdmacm stand-in
	ucx-utils       # ucx_info, ucx_perftest, io_demo: UCX run through vrnic-run (internal/mwprogs)
	openmpi-bin     # mpirun with pml ucx: MPI jobs across two daemons (internal/mwprogs)
	libopenmpi-dev  # mpicc, to build the checking MPI program
	netcat-openbsd      # nc: the TCP client TestRsocketPreload runs over rsockets with librspreload.so
	netcat-traditional  # nc.traditional: its server (it calls accept, which Debian 12's librspreload wraps; accept4 it does not)
	libfabric-bin   # fi_info, fi_pingpong: libfabric's verbs provider through vrnic-run (tests/ibverbs/fabric_test.go)
	python3-pyverbs # rdma-core's own verbs test suite, run through vrnic-run (tests/ibverbs/pyverbs_test.go)
	prometheus      # promtool check metrics on a scrape of the daemon (cmd/vrnicd/metrics_test.go)
	systemd         # systemd-analyze verify checks the units in deploy/systemd (cmd/vrnicd/systemd_test.go)
)

installed() {
	dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "ok installed"
}

# tracefs: TestPostSyscalls counts a thread's system calls with perf events
# on syscall tracepoints, whose ids it reads from tracefs. Some machines
# boot without it mounted at /sys/kernel/tracing; as root, mount it there.
mount_tracefs() {
	local dir=/sys/kernel/tracing
	[ -e "$dir/events/raw_syscalls" ] || [ -e /sys/kernel/debug/tracing/events/raw_syscalls ] && return 0
	if [ "$(id -u)" -ne 0 ] || [ ! -d "$dir" ] || ! grep -qw tracefs /proc/filesystems; then
		echo "install-deps: tracefs is not mounted and cannot be mounted here (the syscall-count test will skip)" >&2
		return 0
	fi
	if mount -t tracefs nodev "$dir"; then
		echo "install-deps: mounted tracefs on $dir"
	else
		echo "install-deps: mount -t tracefs nodev $dir failed (the syscall-count test will skip)" >&2
	fi
}
mount_tracefs

missing=()
for p in "${pkgs[@]}"; do
	installed "$p" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -ne 0 ]; then
	if [ "${CI:-}" = "true" ]; then
		echo "install-deps: not root; missing packages: ${missing[*]} (CI=true: the tests that need them will fail)" >&2
	else
		echo "install-deps: not root; missing packages: ${missing[*]} (tests that need them will skip)" >&2
	fi
	exit 0
fi
export DEBIAN_FRONTEND=noninteractive
if ! apt-get update -qq; then
	echo "install-deps: apt-get update failed" >&2
	exit 1
fi
if ! apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; then
	echo "install-deps: apt-get install ${missing[*]} failed" >&2
	exit 1
fi
still=()
for p in "${missing[@]}"; do
	installed "$p" || still+=("$p")
done
if [ ${#still[@]} -ne 0 ]; then
	echo "install-deps: still missing after apt-get install: ${still[*]}" >&2
	exit 1
fi
echo "install-deps: installed ${missing[*]}"
