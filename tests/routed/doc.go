// Package routed holds vrnic's many-hosts tests: four "hosts" (network
// namespaces) on a routed IPv4/IPv6 network, a daemon in each.
package routed
