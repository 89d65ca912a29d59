package link_test

import (
	"fmt"
	"log/slog"
	"net/netip"

	"github.com/vrnic/vrnic/link"
	"github.com/vrnic/vrnic/roce"
)

// Two devices on one host, 127.77.0.1:4791 and 127.77.0.2:4791 (any
// 127.0.0.0/8 address works without setup), exchange one RoCE v2 frame
// over UDP: the sender's engine builds a whole Ethernet frame on a path
// the link conformed, the receiver gets a frame whose ICRC verifies.
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
	path := roce.Path{Dst: b.LocalAddr().Addr(), TTL: 64}
	a.ConformPath(&path)
	buf := make([]byte, 4096+256)
	h := roce.Headers{BTH: roce.BTHFields{Opcode: roce.OpRCSendOnly, PKey: 0xffff, DestQP: 0x22, PSN: 7}}
	off := path.Headroom(h.BTH.Opcode)
	n := copy(buf[off:], "hello")
	frame, err := path.Build(buf, off, n, &h)
	if err != nil {
		fmt.Println(err)
		return
	}
	sender := a.Ports()[roce.SteerQueue(0x11, 2)]
	if _, err := sender.SendBatch([][]byte{frame}); err != nil {
		fmt.Println(err)
		return
	}

	// The receiver: the worker owning QP 0x22 gets it.
	owner := b.Ports()[roce.SteerQueue(0x22, 2)]
	<-owner.Ready()
	rx := [][]byte{make([]byte, 4096+256)}
	k, err := owner.RecvBatch(rx)
	if err != nil || k != 1 {
		fmt.Println(k, err)
		return
	}
	var pkt roce.Packet
	if err := roce.Parse(rx[0], &pkt); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("%v from %v:%d, QP %#x, PSN %d, %q\n", pkt.Opcode(), pkt.Src(), pkt.UDP.SrcPort(), pkt.BTH.DestQP(), pkt.BTH.PSN(), pkt.Payload)
	// Output: RC_SEND_ONLY from 127.77.0.1:4791, QP 0x22, PSN 7, "hello"
}
