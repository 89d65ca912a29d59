package tap

import (
	"encoding/binary"

	"golang.org/x/sys/unix"
)

// The virtio-net header (struct virtio_net_hdr, include/uapi/linux/
// virtio_net.h) that precedes every frame read from or written to a queue
// of a device created with IFF_VNET_HDR. Its size is the kernel's default
// (TUNSETVNETHDRSZ, 10 bytes: no num_buffers field); its fields are little
// endian (TUNSETVNETLE, set at creation).
//
//	byte 0  flags        VIRTIO_NET_HDR_F_NEEDS_CSUM, _DATA_VALID
//	byte 1  gso_type     VIRTIO_NET_HDR_GSO_NONE, _UDP_L4, ... (| _ECN)
//	2..3    hdr_len      bytes of headers (Ethernet through UDP/TCP)
//	4..5    gso_size     bytes of payload per segment
//	6..7    csum_start   where the checksum starts (the L4 header)
//	8..9    csum_offset  where it is stored, from csum_start
const VnetHdrLen = 10

// Virtio-net header flag and GSO type values.
const (
	VnetFlagNeedsCsum = unix.VIRTIO_NET_HDR_F_NEEDS_CSUM
	VnetFlagDataValid = unix.VIRTIO_NET_HDR_F_DATA_VALID
	VnetGSONone       = unix.VIRTIO_NET_HDR_GSO_NONE
	VnetGSOUDPL4      = unix.VIRTIO_NET_HDR_GSO_UDP_L4
	VnetGSOECN        = unix.VIRTIO_NET_HDR_GSO_ECN
)

// VnetHdr is a virtio-net header in host form.
type VnetHdr struct {
	Flags      uint8
	GSOType    uint8
	HdrLen     uint16
	GSOSize    uint16
	CsumStart  uint16
	CsumOffset uint16
}

// Encode writes h to b[:VnetHdrLen].
func (h *VnetHdr) Encode(b []byte) {
	_ = b[VnetHdrLen-1]
	b[0], b[1] = h.Flags, h.GSOType
	le := binary.LittleEndian
	le.PutUint16(b[2:], h.HdrLen)
	le.PutUint16(b[4:], h.GSOSize)
	le.PutUint16(b[6:], h.CsumStart)
	le.PutUint16(b[8:], h.CsumOffset)
}

// Decode reads h from b[:VnetHdrLen].
func (h *VnetHdr) Decode(b []byte) {
	_ = b[VnetHdrLen-1]
	le := binary.LittleEndian
	*h = VnetHdr{
		Flags: b[0], GSOType: b[1], HdrLen: le.Uint16(b[2:]), GSOSize: le.Uint16(b[4:]),
		CsumStart: le.Uint16(b[6:]), CsumOffset: le.Uint16(b[8:]),
	}
}

// offloadFlags are the offloads a device with a virtio-net header asks for
// (TUNSETOFFLOAD): the kernel may hand the queue packets with a partial
// checksum and UDP packets still to be segmented (USO), and takes both
// from it. No TSO: vrnic carries no TCP.
const offloadFlags = unix.TUN_F_CSUM | unix.TUN_F_USO4 | unix.TUN_F_USO6
