package capture

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"time"
)

// pcapng (the PCAP Next Generation capture file format): a Section Header
// Block, one Interface Description Block (Ethernet, nanosecond
// timestamps), then one Enhanced Packet Block per frame, which may carry
// a comment (opt_comment): where a capture marks what was done to a frame.
// Little-endian, as the section header's byte-order magic says.

const (
	blockSHB      = 0x0A0D0D0A
	blockIDB      = 0x00000001
	blockEPB      = 0x00000006
	byteOrder     = 0x1A2B3C4D
	linkEthernet  = 1
	optEnd        = 0
	optComment    = 1
	optIfTsresol  = 9
	tsresolNanos  = 9 // 10^-9 s
	maxCommentLen = 1 << 12
)

type pcapngWriter struct {
	w   io.Writer
	buf []byte
}

func newPcapngWriter(w io.Writer) (*pcapngWriter, error) {
	p := &pcapngWriter{w: w}
	// Section Header Block: version 1.0, section length unknown (-1).
	body := make([]byte, 16)
	binary.LittleEndian.PutUint32(body[0:], byteOrder)
	binary.LittleEndian.PutUint16(body[4:], 1)
	binary.LittleEndian.PutUint16(body[6:], 0)
	binary.LittleEndian.PutUint64(body[8:], ^uint64(0))
	if err := p.block(blockSHB, body, nil); err != nil {
		return nil, err
	}
	// Interface Description Block: Ethernet, no snap length limit,
	// nanosecond timestamps.
	body = make([]byte, 8)
	binary.LittleEndian.PutUint16(body[0:], linkEthernet)
	opts := option(nil, optIfTsresol, []byte{tsresolNanos})
	if err := p.block(blockIDB, body, opts); err != nil {
		return nil, err
	}
	return p, nil
}

// packet writes one Enhanced Packet Block captured at unix nanoseconds
// at, with a comment on the frame (none if empty).
func (p *pcapngWriter) packet(at int64, frame []byte, comment string) error {
	var hdr [20]byte
	ts := uint64(at)
	binary.LittleEndian.PutUint32(hdr[0:], 0) // interface 0
	binary.LittleEndian.PutUint32(hdr[4:], uint32(ts>>32))
	binary.LittleEndian.PutUint32(hdr[8:], uint32(ts))
	binary.LittleEndian.PutUint32(hdr[12:], uint32(len(frame)))
	binary.LittleEndian.PutUint32(hdr[16:], uint32(len(frame)))
	body := append(append(p.buf[:0], hdr[:]...), frame...)
	body = pad4(body)
	var opts []byte
	if comment != "" {
		if len(comment) > maxCommentLen {
			comment = comment[:maxCommentLen]
		}
		opts = option(nil, optComment, []byte(comment))
	}
	p.buf = body
	return p.block(blockEPB, body, opts)
}

// block writes a block: type, total length, body, options (ended by
// opt_endofopt when there are any), total length again.
func (p *pcapngWriter) block(typ uint32, body, opts []byte) error {
	if len(opts) > 0 {
		opts = option(opts, optEnd, nil)
	}
	total := 12 + len(body) + len(opts)
	b := make([]byte, 0, total)
	b = binary.LittleEndian.AppendUint32(b, typ)
	b = binary.LittleEndian.AppendUint32(b, uint32(total))
	b = append(b, body...)
	b = append(b, opts...)
	b = binary.LittleEndian.AppendUint32(b, uint32(total))
	_, err := p.w.Write(b)
	return err
}

// option appends an option (code, length, value padded to 4 bytes).
func option(dst []byte, code uint16, v []byte) []byte {
	dst = binary.LittleEndian.AppendUint16(dst, code)
	dst = binary.LittleEndian.AppendUint16(dst, uint16(len(v)))
	dst = append(dst, v...)
	return pad4(dst)
}

func pad4(b []byte) []byte {
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}

// Frame is one frame of a pcapng capture as ReadFrames returns it.
type Frame struct {
	At      time.Time
	Data    []byte
	Comment string // the frame's opt_comment, if any
}

// ReadFrames returns the frames (Enhanced Packet Blocks) of a little-endian
// pcapng capture as this package writes them, checking every block's
// framing. Timestamps are read as nanoseconds (this package's resolution).
func ReadFrames(b []byte) ([]Frame, error) {
	le := binary.LittleEndian
	var out []Frame
	for o := 0; o < len(b); {
		if len(b)-o < 12 {
			return out, fmt.Errorf("capture: %d trailing bytes", len(b)-o)
		}
		typ, n := le.Uint32(b[o:]), int(le.Uint32(b[o+4:]))
		if n < 12 || n%4 != 0 || n > len(b)-o || le.Uint32(b[o+n-4:]) != uint32(n) {
			return out, fmt.Errorf("capture: bad block at offset %d (length %d)", o, n)
		}
		if o == 0 && (typ != blockSHB || n < 28 || le.Uint32(b[8:]) != byteOrder) {
			return nil, errors.New("capture: not a little-endian pcapng stream")
		}
		if typ == blockEPB {
			if n < 32 {
				return out, fmt.Errorf("capture: short packet block at offset %d", o)
			}
			cl := int(le.Uint32(b[o+20:]))
			end := o + n - 4
			data := o + 28
			if cl < 0 || data+cl > end {
				return out, fmt.Errorf("capture: packet block at offset %d: captured length %d", o, cl)
			}
			ts := uint64(le.Uint32(b[o+12:]))<<32 | uint64(le.Uint32(b[o+16:]))
			f := Frame{At: time.Unix(0, int64(ts)), Data: b[data : data+cl]}
			for opt := data + (cl+3)&^3; opt+4 <= end; {
				code, l := le.Uint16(b[opt:]), int(le.Uint16(b[opt+2:]))
				if code == optEnd || opt+4+l > end {
					break
				}
				if code == optComment {
					f.Comment = string(b[opt+4 : opt+4+l])
				}
				opt += 4 + (l+3)&^3
			}
			out = append(out, f)
		}
		o += n
	}
	return out, nil
}
