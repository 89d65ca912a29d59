#!/bin/sh
# Measures the loss table (tests/loss; BENCHMARKS.md, "Loss"): two vrnicd
# daemons, vrnic-perf write_bw (64 KiB), send_lat and read_lat (8 B), clean
# and under seeded loss (0.1% and 1% of the requests dropped; 5% each way
# plus duplicates, reordering and 1% corruption), through the daemons' fault
# rules and, as root, the kernel tc injector; in go-back-N and, when
# vrnic-perf has -selective-repeat, selective repeat. Prints the tables as
# Markdown on standard output; the test's log goes to standard error.
#
# Environment (defaults in brackets):
#   VRNIC_LOSS_REPS        repetitions [3]
#   VRNIC_LOSS_DURATION    each test's duration [3s]
#   VRNIC_LOSS_MODES       gbn,sr [gbn,sr]; sr is skipped without the flag
#   VRNIC_LOSS_INJECTORS   rules,kernel [rules,kernel]; kernel needs root
#   VRNIC_LOSS_CONDITIONS  drop0.1,drop1,mix [all three; the clean run always]
#   VRNIC_LOSS_DEPTH       write_bw's outstanding WRITEs [vrnic-perf's 128]
#   VRNIC_LOSS_REPORT      also keep the Markdown in this file
set -eu
cd "$(dirname "$0")/.."
report=${VRNIC_LOSS_REPORT:-}
tmp=
if [ -z "$report" ]; then
	tmp=$(mktemp)
	report=$tmp
fi
trap '[ -z "$tmp" ] || rm -f "$tmp"' EXIT
VRNIC_LOSS_TABLE=1 VRNIC_LOSS_REPORT=$report \
	go test -count=1 -timeout 90m -v -run '^TestLossTable$' ./tests/loss/ >&2
cat "$report"
