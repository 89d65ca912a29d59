// Package abi is the Go mirror of the vrnic client ABI, vrnic_abi.h.
//
// The C header in this directory is the contract between vrnicd and its
// clients; this package restates every struct, enum and #define of it in Go
// with the same field order, sizes and offsets (little-endian, natural
// alignment, explicit reserved fields, no implicit padding). A test compiles
// a C program against the header and fails on any drift in a size, an
// offset or a constant.
//
// Memory layouts, in bytes (see the header for field meanings):
//
//	control datagram   MsgHdr (16) | command or reply struct | [u64 pages]
//	send WQE slot      block 0: SendWQE (64) | blocks 1..: SGE (16) x4 per block, or inline data
//	receive WQE slot   RecvWQE (16) | SGE (16) x num_sge, rounded up to 64
//	CQE                CQE (32), owner byte (offset 31) written last
//	doorbell page      DBPageSize bytes of 128-byte records; record 0 = DBHeader,
//	                   others DBQP / DBCQ / DBSRQ: bytes 0..63 client-written,
//	                   bytes 64..127 daemon-written
//
// Hot-path structs (SendWQE, SGE, RecvWQE, CQE, MsgHdr) have hand-written
// Put/Decode methods that neither reflect nor allocate; each field's byte
// offset is one constant both use, compared with offsetof by the same
// test. Control-path structs use Marshal/Unmarshal (encoding/binary).
//
// The package imports only the standard library; every other vrnic
// package, and a client, may import it.
package abi
