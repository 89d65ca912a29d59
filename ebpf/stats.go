package ebpf

//go:generate go tool stringer -type=FilterReason -linecomment -output=stats_string.go

import (
	"fmt"

	"github.com/cilium/ebpf"
)

// SteerStats are the steering program's counters, summed over CPUs.
type SteerStats struct {
	// Steered[q] counts RoCE v2 frames steered to queue q.
	Steered []uint64
	// NonRoCE counts frames that were not RoCE v2 (sent to queue 0).
	NonRoCE uint64
}

// FilterReason is the verdict reason of the filter program; the values are
// the C enum filter_reason (vrnic_bpf.h). Its String method is generated
// from the line comments of the constants: the counter names the daemon
// reports (vrnicctl link).
type FilterReason uint32

// Filter verdict reasons; the first four pass the frame, the others drop it.
const (
	FilterPassARP          = FilterReason(filterFilterReasonFILTER_PASS_ARP)           // pass_arp
	FilterPassND           = FilterReason(filterFilterReasonFILTER_PASS_ND)            // pass_nd
	FilterPassRoCEv4       = FilterReason(filterFilterReasonFILTER_PASS_ROCE_V4)       // pass_roce_v4
	FilterPassRoCEv6       = FilterReason(filterFilterReasonFILTER_PASS_ROCE_V6)       // pass_roce_v6
	FilterDropTruncated    = FilterReason(filterFilterReasonFILTER_DROP_TRUNCATED)     // drop_truncated
	FilterDropEtherType    = FilterReason(filterFilterReasonFILTER_DROP_ETHERTYPE)     // drop_ethertype
	FilterDropARPMalformed = FilterReason(filterFilterReasonFILTER_DROP_ARP_MALFORMED) // drop_arp_malformed
	FilterDropARPNotOurs   = FilterReason(filterFilterReasonFILTER_DROP_ARP_NOT_OURS)  // drop_arp_not_ours
	FilterDropIPMalformed  = FilterReason(filterFilterReasonFILTER_DROP_IP_MALFORMED)  // drop_ip_malformed
	FilterDropIPFragment   = FilterReason(filterFilterReasonFILTER_DROP_IP_FRAGMENT)   // drop_ip_fragment
	FilterDropL4Proto      = FilterReason(filterFilterReasonFILTER_DROP_L4PROTO)       // drop_l4_proto
	FilterDropUDPPort      = FilterReason(filterFilterReasonFILTER_DROP_UDP_PORT)      // drop_udp_port
	FilterDropAddrNotOurs  = FilterReason(filterFilterReasonFILTER_DROP_ADDR_NOT_OURS) // drop_addr_not_ours
	FilterDropNDNotOurs    = FilterReason(filterFilterReasonFILTER_DROP_ND_NOT_OURS)   // drop_nd_not_ours
	FilterDropNDMalformed  = FilterReason(filterFilterReasonFILTER_DROP_ND_MALFORMED)  // drop_nd_malformed
	FilterDropICMPv6Other  = FilterReason(filterFilterReasonFILTER_DROP_ICMPV6OTHER)   // drop_icmpv6_other

	// NumFilterReasons is the number of reasons (size of FilterStats).
	NumFilterReasons = int(filterFilterReasonFILTER_REASON_MAX)
)

// Pass tells whether frames with this reason are kept.
func (r FilterReason) Pass() bool { return r <= FilterPassRoCEv6 }

// FilterStats are the filter program's counters by reason, summed over CPUs.
type FilterStats [NumFilterReasons]uint64

// Dropped returns the number of frames dropped for any reason.
func (s *FilterStats) Dropped() uint64 {
	var n uint64
	for r, c := range s {
		if !FilterReason(r).Pass() {
			n += c
		}
	}
	return n
}

// SteerStats reads the steering counters (Steered has Queues() entries).
func (p *Programs) SteerStats() (SteerStats, error) {
	st := SteerStats{Steered: make([]uint64, p.queues)}
	var err error
	for q := range st.Steered {
		if st.Steered[q], err = sumPerCPU(p.steer.SteerStats, uint32(q)); err != nil {
			return st, err
		}
	}
	st.NonRoCE, err = sumPerCPU(p.steer.SteerStats, uint32(MaxQueues))
	return st, err
}

// FilterStats reads the filter counters.
func (p *Programs) FilterStats() (FilterStats, error) {
	var st FilterStats
	for r := range st {
		c, err := sumPerCPU(p.filter.FilterStats, uint32(r))
		if err != nil {
			return st, err
		}
		st[r] = c
	}
	return st, nil
}

func sumPerCPU(m *ebpf.Map, key uint32) (uint64, error) {
	var vals []uint64
	if err := m.Lookup(key, &vals); err != nil {
		return 0, fmt.Errorf("ebpf: read %s[%d]: %w", m, key, err)
	}
	var n uint64
	for _, v := range vals {
		n += v
	}
	return n, nil
}
