package verbs

import (
	"fmt"

	"github.com/vrnic/vrnic/abi"
	"golang.org/x/sys/unix"
)

// The IBTA 1.5 Memory Placement Extensions (ABI 1.4, RC only): ATOMIC
// WRITE and FLUSH, as the project's C library gives them to libibverbs
// programs (ibv_wr_atomic_write, ibv_wr_flush). DeviceAttrEx says what the
// device supports (DeviceCapExAtomicWrite, DeviceCapExFlushGlobal).

// AtomicWriteWR returns an ATOMIC WRITE work request: the 8 bytes of
// value are stored at remoteAddr (8-byte aligned; else the responder
// answers NAK invalid request, REM_INV_REQ_ERR) of the MR of rkey, which
// needs remote write access (else REM_ACCESS_ERR), at once: a reader never
// sees part of them. No SGE: the value travels in the WQE, read at post
// time. It completes with abi.WCAtomicWrite.
func AtomicWriteWR(wrID uint64, flags abi.SendFlags, remoteAddr uint64, rkey uint32, value [8]byte) SendWR {
	var v uint64
	for i := 7; i >= 0; i-- {
		v = v<<8 | uint64(value[i]) // little-endian in the WQE, stored as it lies
	}
	return SendWR{WrID: wrID, Opcode: abi.WRAtomicWrite, Flags: flags, RemoteAddr: remoteAddr, RKey: rkey, CompareAdd: v}
}

// FlushWR returns a FLUSH work request: the responder makes the data of
// earlier WRITEs to [remoteAddr, remoteAddr+length) (level abi.FlushRange)
// or to the whole MR of rkey (abi.FlushMR) reach the placement types in
// placement (abi.FlushGlobal, abi.FlushPersistent; at least one) before it
// answers. The MR needs the matching access (abi.AccessFlushGlobal; else
// REM_ACCESS_ERR). It completes with abi.WCFlush. A placement of none or
// of unknown bits, an unknown level or a length beyond the largest message
// is EINVAL, as ibv_wr_flush gives.
func FlushWR(wrID uint64, flags abi.SendFlags, remoteAddr uint64, rkey uint32, length uint64, placement, level uint8) (SendWR, error) {
	if placement == 0 || placement&^(abi.FlushGlobal|abi.FlushPersistent) != 0 || level > abi.FlushMR || length > abi.MaxMsgBytes {
		return SendWR{}, fmt.Errorf("verbs: FlushWR(placement %#x, level %d, length %d): %w", placement, level, length, unix.EINVAL)
	}
	return SendWR{WrID: wrID, Opcode: abi.WRFlush, Flags: flags, RemoteAddr: remoteAddr, RKey: rkey,
		CompareAdd: length, Swap: abi.FlushWQEBits(placement, level)}, nil
}
