package link_test

import (
	"fmt"
	"log/slog"
	"net/netip"

	"github.com/vrnic/vrnic/link"
	"github.com/vrnic/vrnic/roce"
)

// Two devices on one host, 127.77.0.1:4791 and 127.77.0.2:4791 (any
// 127.0.0.0/8 address works without setup), exchange one RoCE v2 packet
// over UDP: the sender's engine builds the UDP payload (roce.ModeUDP, the
// ICRC over the pseudo header of the two sockets) and hands it to the
// link with the destination beside it; the receiver gets the payload with
// the sender beside it and verifies the ICRC with them.
func ExampleNewUDP() {
	quiet := slog.New(slog.DiscardHandler)
	a, err := link.NewUDP(link.UDPConfig{Local: netip.MustParseAddrPort("127.77.0.1:4791"), Workers: 2, FrameCap: 4096 + 256, Logger: quiet})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer a.Close()
	b, err := link.NewUDP(link.UDPConfig{Local: netip.MustParseAddrPort("127.77.0.2:4791"), Workers: 2, FrameCap: 4096 + 256, Logger: quiet})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer b.Close()

	// The sender: QP 0x11 on device a writes to QP 0x22 on device b.
	from, to := a.LocalAddr(), b.LocalAddr()
	path := roce.Path{Mode: roce.ModeUDP, Src: from.Addr(), SrcPort: from.Port(), Dst: to.Addr(), DstPort: to.Port()}
	buf := make([]byte, 4096+256)
	h := roce.Headers{BTH: roce.BTHFields{Opcode: roce.OpRCSendOnly, PKey: 0xffff, DestQP: 0x22, PSN: 7}}
	off := path.Headroom(h.BTH.Opcode)
	n := copy(buf[off:], "hello")
	payload, err := path.Build(buf, off, n, &h)
	if err != nil {
		fmt.Println(err)
		return
	}
	sender := a.Ports()[roce.SteerQueue(0x11, 2)]
	if _, err := sender.SendBatch([][]byte{payload}, []netip.AddrPort{to}); err != nil {
		fmt.Println(err)
		return
	}

	// The receiver: the worker owning QP 0x22 gets it.
	owner := b.Ports()[roce.SteerQueue(0x22, 2)]
	<-owner.Ready()
	rx, peers := [][]byte{make([]byte, 4096+256)}, make([]netip.AddrPort, 1)
	k, err := owner.RecvBatch(rx, peers)
	if err != nil || k != 1 {
		fmt.Println(k, err)
		return
	}
	ps := roce.Pseudo{Src: peers[0].Addr(), SrcPort: peers[0].Port(), Dst: to.Addr(), DstPort: to.Port()}
	var pkt roce.Packet
	if err := roce.ParseUDP(rx[0], &ps, &pkt); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("%v from %v, QP %#x, PSN %d, %q\n", pkt.Opcode(), peers[0], pkt.BTH.DestQP(), pkt.BTH.PSN(), pkt.Payload)
	// Output: RC_SEND_ONLY from 127.77.0.1:4791, QP 0x22, PSN 7, "hello"
}
