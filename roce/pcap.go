package roce

import (
	"encoding/binary"
	"fmt"
	"io"
	"time"
)

// Classic pcap files (the libpcap format, not pcapng): a 24-byte global
// header, then per packet a 16-byte record header (seconds, micro- or
// nanoseconds, captured length, original length) and the bytes.

const (
	pcapMagicMicro   = 0xa1b2c3d4
	pcapMagicNano    = 0xa1b23c4d
	pcapVersionMajor = 2
	pcapVersionMinor = 4
	// LinkTypeEthernet is the pcap link type of Ethernet frames.
	LinkTypeEthernet = 1
	pcapHeaderLen    = 24
	pcapRecordLen    = 16
	// pcapMaxSnap bounds the records the reader accepts.
	pcapMaxSnap = 262144
)

// PcapWriter writes a classic pcap stream with link type Ethernet. It is
// not safe for concurrent use.
type PcapWriter struct {
	w    io.Writer
	nano bool
	hdr  [pcapRecordLen]byte
}

// NewPcapWriter writes the global header to w and returns a writer whose
// timestamps have nanosecond (nano) or microsecond resolution.
func NewPcapWriter(w io.Writer, nano bool) (*PcapWriter, error) {
	var h [pcapHeaderLen]byte
	magic := uint32(pcapMagicMicro)
	if nano {
		magic = pcapMagicNano
	}
	binary.LittleEndian.PutUint32(h[0:], magic)
	binary.LittleEndian.PutUint16(h[4:], pcapVersionMajor)
	binary.LittleEndian.PutUint16(h[6:], pcapVersionMinor)
	// thiszone and sigfigs stay 0.
	binary.LittleEndian.PutUint32(h[16:], pcapMaxSnap)
	binary.LittleEndian.PutUint32(h[20:], LinkTypeEthernet)
	if _, err := w.Write(h[:]); err != nil {
		return nil, err
	}
	return &PcapWriter{w: w, nano: nano}, nil
}

// WritePacket writes one frame captured at ts.
func (pw *PcapWriter) WritePacket(ts time.Time, frame []byte) error {
	if len(frame) > pcapMaxSnap {
		return fmt.Errorf("%w: %d-byte frame exceeds the snap length", ErrBadPcap, len(frame))
	}
	frac := uint32(ts.Nanosecond() / 1000)
	if pw.nano {
		frac = uint32(ts.Nanosecond())
	}
	binary.LittleEndian.PutUint32(pw.hdr[0:], uint32(ts.Unix()))
	binary.LittleEndian.PutUint32(pw.hdr[4:], frac)
	binary.LittleEndian.PutUint32(pw.hdr[8:], uint32(len(frame)))
	binary.LittleEndian.PutUint32(pw.hdr[12:], uint32(len(frame)))
	if _, err := pw.w.Write(pw.hdr[:]); err != nil {
		return err
	}
	_, err := pw.w.Write(frame)
	return err
}

// PcapReader reads a classic pcap stream (either byte order, micro- or
// nanosecond timestamps).
type PcapReader struct {
	r        io.Reader
	order    binary.ByteOrder
	nano     bool
	linkType uint32
	hdr      [pcapRecordLen]byte
	buf      []byte
}

// NewPcapReader reads and checks the global header.
func NewPcapReader(r io.Reader) (*PcapReader, error) {
	var h [pcapHeaderLen]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return nil, fmt.Errorf("%w: global header: %w", ErrBadPcap, err)
	}
	pr := &PcapReader{r: r}
	switch {
	case binary.LittleEndian.Uint32(h[0:]) == pcapMagicMicro:
		pr.order = binary.LittleEndian
	case binary.LittleEndian.Uint32(h[0:]) == pcapMagicNano:
		pr.order, pr.nano = binary.LittleEndian, true
	case binary.BigEndian.Uint32(h[0:]) == pcapMagicMicro:
		pr.order = binary.BigEndian
	case binary.BigEndian.Uint32(h[0:]) == pcapMagicNano:
		pr.order, pr.nano = binary.BigEndian, true
	default:
		return nil, fmt.Errorf("%w: magic %08x", ErrBadPcap, binary.LittleEndian.Uint32(h[0:]))
	}
	pr.linkType = pr.order.Uint32(h[20:])
	return pr, nil
}

// LinkType returns the link type of the stream (LinkTypeEthernet for
// Ethernet frames).
func (pr *PcapReader) LinkType() uint32 { return pr.linkType }

// Next returns the next record. data is valid until the next call. At the
// end of the stream it returns io.EOF.
func (pr *PcapReader) Next() (ts time.Time, data []byte, err error) {
	if _, err := io.ReadFull(pr.r, pr.hdr[:]); err != nil {
		if err == io.EOF {
			return time.Time{}, nil, io.EOF
		}
		return time.Time{}, nil, fmt.Errorf("%w: record header: %w", ErrBadPcap, err)
	}
	sec := pr.order.Uint32(pr.hdr[0:])
	frac := pr.order.Uint32(pr.hdr[4:])
	caplen := pr.order.Uint32(pr.hdr[8:])
	if caplen > pcapMaxSnap {
		return time.Time{}, nil, fmt.Errorf("%w: record of %d bytes", ErrBadPcap, caplen)
	}
	if cap(pr.buf) < int(caplen) {
		pr.buf = make([]byte, caplen)
	}
	data = pr.buf[:caplen]
	if _, err := io.ReadFull(pr.r, data); err != nil {
		return time.Time{}, nil, fmt.Errorf("%w: record data: %w", ErrBadPcap, err)
	}
	nsec := int64(frac) * 1000
	if pr.nano {
		nsec = int64(frac)
	}
	return time.Unix(int64(sec), nsec).UTC(), data, nil
}
