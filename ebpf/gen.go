package ebpf

// The C sources live in bpf/ (go build refuses .c files in the directory
// of a package that does not use cgo). The objects are generated for
// little-endian targets only (bpfel); the generated Go and .o files are
// committed so a build needs no clang. scripts/check-bpf.sh regenerates
// them and fails on any difference.
//
//go:generate go tool bpf2go -cc clang-14 -strip llvm-strip-14 -target bpfel -no-global-types -type steer_config steer bpf/steer.c -- -O2 -Wall -Werror -Ibpf
//go:generate go tool bpf2go -cc clang-14 -strip llvm-strip-14 -target bpfel -no-global-types -type filter_reason filter bpf/filter.c -- -O2 -Wall -Werror -Ibpf
//go:generate go tool bpf2go -cc clang-14 -strip llvm-strip-14 -target bpfel -no-global-types -type tcfault_rule -type tcfault_count -type tcfault_config tcfault bpf/tcfault.c -- -O2 -Wall -Werror -mcpu=v3 -Ibpf
