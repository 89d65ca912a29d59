package abi

import "testing"

// BenchmarkHotCodecs times the Put and Decode methods the daemon and the
// client run per WQE and per CQE.
func BenchmarkHotCodecs(b *testing.B) {
	var buf [SizeofSendWQE]byte
	b.Run("SendWQE", func(b *testing.B) {
		w := SendWQE{WrID: 1, Opcode: WRRDMAWrite, Flags: SendSignaled, NumSGE: 2, RemoteAddr: 4096, RKey: 7}
		var d SendWQE
		for i := range b.N {
			w.WrID = uint64(i)
			w.Put(buf[:])
			d.Decode(buf[:])
		}
	})
	b.Run("SGE", func(b *testing.B) {
		s := SGE{Addr: 4096, Length: 64, LKey: 3}
		var d SGE
		for i := range b.N {
			s.Length = uint32(i)
			s.Put(buf[:])
			d.Decode(buf[:])
		}
	})
	b.Run("RecvWQE", func(b *testing.B) {
		r := RecvWQE{NumSGE: 1}
		var d RecvWQE
		for i := range b.N {
			r.WrID = uint64(i)
			r.Put(buf[:])
			d.Decode(buf[:])
		}
	})
	b.Run("CQE", func(b *testing.B) {
		c := CQE{ByteLen: 64, QPNum: 17, Opcode: WCRecv, Owner: 1}
		var d CQE
		for i := range b.N {
			c.WrID = uint64(i)
			c.Put(buf[:])
			d.Decode(buf[:])
		}
	})
}
