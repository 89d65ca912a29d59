package ebpf

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/cilium/ebpf"
	"github.com/vrnic/vrnic/roce"
)

// ErrSteeringMismatch reports that the steering program and
// roce.SteerQueue disagree on a QP's queue.
var ErrSteeringMismatch = errors.New("ebpf: steering program disagrees with roce.SteerQueue")

// VerifySteering proves, on the running kernel, that the loaded steering
// program picks roce.SteerQueue(qpn, Queues()) for every qpn: it runs the
// program with BPF_PROG_TEST_RUN on an IPv4 and an IPv6 RoCE v2 frame
// (the second one VLAN-tagged) per QPN and applies the kernel's rule
// ((u16)ret % queues). The runs count in the steering counters.
func (p *Programs) VerifySteering(qpns []uint32) error {
	return verifySteering(p.steer.VrnicSteer, qpns, p.queues)
}

func verifySteering(prog *ebpf.Program, qpns []uint32, queues int) error {
	v4 := roceFrame{src: netip.MustParseAddr("192.0.2.1"), dst: netip.MustParseAddr("192.0.2.2")}
	v6 := roceFrame{src: netip.MustParseAddr("2001:db8::1"), dst: netip.MustParseAddr("2001:db8::2"), vlan: true}
	for _, qpn := range qpns {
		for _, f := range []roceFrame{v4, v6} {
			f.qpn = qpn
			ret, err := prog.Run(&ebpf.RunOptions{Data: buildRoCEFrame(f)})
			if err != nil {
				return fmt.Errorf("ebpf: test run of steering program: %w", err)
			}
			got := int(uint16(ret)) % queues
			if want := roce.SteerQueue(qpn, queues); got != want || ret != roce.SteerHash(qpn) {
				return fmt.Errorf("%w: qpn %#x (%v): program returned %#x (queue %d), want hash %#x (queue %d)",
					ErrSteeringMismatch, qpn, f.dst, ret, got, roce.SteerHash(qpn), want)
			}
		}
	}
	return nil
}
