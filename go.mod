module github.com/vrnic/vrnic

go 1.26.0

require (
	github.com/cilium/ebpf v0.22.0
	github.com/stretchr/testify v1.12.1
	github.com/vishvananda/netlink v1.3.1
	go.uber.org/goleak v1.3.0
	go.yaml.in/yaml/v3 v3.0.5
	golang.org/x/sys v0.49.0
)

require (
	github.com/vishvananda/netns v0.0.5 // indirect
	golang.org/x/mod v0.42.0 // indirect
	golang.org/x/sync v0.24.0 // indirect
	golang.org/x/tools v0.52.0 // indirect
)

tool (
	github.com/cilium/ebpf/cmd/bpf2go
	golang.org/x/tools/cmd/stringer
)
