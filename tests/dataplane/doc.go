// Package dataplane holds the multi-process tests of vrnic's data path:
// real vrnicd daemons, real client processes, traffic through the
// transport engine over the daemons' links. The binaries (vrnicd,
// vrnic-demo) are built once per run into a temporary directory.
package dataplane
