package roce

import (
	"hash/crc32"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// writeCase is a 4 KiB RDMA WRITE ONLY, the common bulk packet.
func writeCase(mode Mode, v6 bool) (Path, Headers, []byte) {
	p := goldenPath(v6, 0x11)
	p.Mode = mode
	h := Headers{
		BTH:  BTHFields{Opcode: OpRCWriteOnly, PKey: DefaultPKey, DestQP: 0x11, PSN: 0x123456, AckReq: true},
		RETH: RETHFields{VA: 0x7f0000000000, RKey: 0x1234, DMALength: 4096},
		IPID: 7,
	}
	buf := make([]byte, MaxHeadroom+4096+MaxTailroom)
	for i := range buf[MaxHeadroom : MaxHeadroom+4096] {
		buf[MaxHeadroom+i] = byte(i)
	}
	return p, h, buf
}

// TestHotPathsDoNotAllocate: Build, Parse and ParseUDP of a 4 KiB RDMA
// WRITE, and the rejection of a corrupt frame, allocate nothing.
func TestHotPathsDoNotAllocate(t *testing.T) {
	for _, v6 := range []bool{false, true} {
		p, h, buf := writeCase(ModeEthernet, v6)
		var frame []byte
		var err error
		assert.Zero(t, testing.AllocsPerRun(100, func() {
			frame, err = p.Build(buf, MaxHeadroom, 4096, &h)
		}), "Build")
		require.NoError(t, err)
		var pkt Packet
		assert.Zero(t, testing.AllocsPerRun(100, func() { err = Parse(frame, &pkt) }), "Parse")
		require.NoError(t, err)
		frame[len(frame)-1] ^= 1
		assert.Zero(t, testing.AllocsPerRun(100, func() { err = Parse(frame, &pkt) }), "Parse of a corrupt frame")
		require.ErrorIs(t, err, ErrICRC)

		p.Mode = ModeUDP
		ps := p.Pseudo()
		assert.Zero(t, testing.AllocsPerRun(100, func() {
			frame, err = p.Build(buf, MaxHeadroom, 4096, &h)
		}), "Build ModeUDP")
		require.NoError(t, err)
		assert.Zero(t, testing.AllocsPerRun(100, func() { err = ParseUDP(frame, &ps, &pkt) }), "ParseUDP")
		require.NoError(t, err)
	}
}

func benchBuild(b *testing.B, mode Mode, v6 bool) {
	p, h, buf := writeCase(mode, v6)
	b.ReportAllocs()
	b.SetBytes(4096)
	for b.Loop() {
		h.BTH.PSN++
		if _, err := p.Build(buf, MaxHeadroom, 4096, &h); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkBuildWrite4K(b *testing.B) {
	b.Run("ethernet-ipv4", func(b *testing.B) { benchBuild(b, ModeEthernet, false) })
	b.Run("ethernet-ipv6", func(b *testing.B) { benchBuild(b, ModeEthernet, true) })
	b.Run("udp", func(b *testing.B) { benchBuild(b, ModeUDP, false) })
}

func benchParse(b *testing.B, mode Mode, v6 bool) {
	p, h, buf := writeCase(mode, v6)
	frame, err := p.Build(buf, MaxHeadroom, 4096, &h)
	require.NoError(b, err)
	ps := p.Pseudo()
	var pkt Packet
	b.ReportAllocs()
	b.SetBytes(4096)
	for b.Loop() {
		if mode == ModeUDP {
			err = ParseUDP(frame, &ps, &pkt)
		} else {
			err = Parse(frame, &pkt)
		}
		if err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkParseWrite4K(b *testing.B) {
	b.Run("ethernet-ipv4", func(b *testing.B) { benchParse(b, ModeEthernet, false) })
	b.Run("ethernet-ipv6", func(b *testing.B) { benchParse(b, ModeEthernet, true) })
	b.Run("udp", func(b *testing.B) { benchParse(b, ModeUDP, false) })
}

var sink uint32

// BenchmarkICRCvsCRC32 measures the ICRC of a 4 KiB RDMA WRITE (IPv4 or
// IPv6 header through pad: 4152 or 4172 bytes) against plain hash/crc32
// (crc32.ChecksumIEEE) over the same bytes, in the same run: the two
// alternate in blocks of 32 calls, and the reported icrc/crc32 is the
// median over all blocks of (crc32 block time / ICRC block time), i.e. the
// ICRC's throughput as a fraction of plain CRC-32's (1.0 = free masking).
// The median keeps other processes on a shared machine from skewing the
// ratio; icrc-MB/s and crc32-MB/s are the plain averages.
func BenchmarkICRCvsCRC32(b *testing.B) {
	for _, v6 := range []bool{false, true} {
		name := "ipv4"
		if v6 {
			name = "ipv6"
		}
		b.Run(name, func(b *testing.B) {
			p, h, buf := writeCase(ModeEthernet, v6)
			frame, err := p.Build(buf, MaxHeadroom, 4096, &h)
			require.NoError(b, err)
			iphl := IPv4HeaderLen
			if v6 {
				iphl = IPv6HeaderLen
			}
			covered := frame[len(frame)-ICRCLen-(iphl+UDPHeaderLen+RETHLen+BTHLen+4096) : len(frame)-ICRCLen]
			require.Equal(b, getICRC(frame[len(frame)-ICRCLen:]), icrcIP(covered, v6, iphl))
			b.ReportAllocs()
			const block = 32
			var tICRC, tCRC time.Duration
			ratios := make([]float64, 0, b.N/block+1)
			b.ResetTimer()
			for done := 0; done < b.N; done += block {
				t0 := time.Now()
				for range block {
					sink ^= crc32.ChecksumIEEE(covered)
				}
				t1 := time.Now()
				for range block {
					sink ^= icrcIP(covered, v6, iphl)
				}
				t2 := time.Now()
				tCRC += t1.Sub(t0)
				tICRC += t2.Sub(t1)
				ratios = append(ratios, float64(t1.Sub(t0))/float64(t2.Sub(t1)))
			}
			b.StopTimer()
			slices.Sort(ratios)
			n := float64(len(ratios) * block)
			mb := float64(len(covered)) * n / 1e6
			b.ReportMetric(mb/tICRC.Seconds(), "icrc-MB/s")
			b.ReportMetric(mb/tCRC.Seconds(), "crc32-MB/s")
			b.ReportMetric(ratios[len(ratios)/2], "icrc/crc32")
		})
	}
}

// BenchmarkUDPSrcPort is here to show the per-QP port choice is cheap
// enough to compute per packet if a caller wants to.
func BenchmarkUDPSrcPort(b *testing.B) {
	var s uint16
	for i := range b.N {
		s ^= UDPSrcPortForFlow(0, uint32(i), 0x11)
	}
	_ = netip.Addr{}
	sink ^= uint32(s)
}
