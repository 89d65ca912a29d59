//go:build amd64

#include "textflag.h"

// icrcFold: CRC-32 (IEEE, bit-reflected) by folding with carry-less
// multiplies, after Intel's "Fast CRC Computation for Generic Polynomials
// Using PCLMULQDQ Instruction". 128-bit lanes hold the message so far,
// congruent modulo P to it; each step folds every lane forward by the
// width of all lanes (its low quadword times x^(D+32) mod P, its high
// quadword times x^(D-32) mod P, see foldK) onto the next block of its
// lane. Narrow (SSE): four lanes X1..X4, 64 bytes a step. Wide (AVX-512
// VPCLMULQDQ): four lanes of four, Z1..Z4, 256 bytes a step, then one
// zmm, 64 bytes a step, then its quarters become X1..X4. Both end alike:
// the lanes fold into X1, 16-byte steps follow, and X1 is reduced to the
// 32-bit CRC state (REDUCE). The mask is OR-ed into the first 128
// bytes (64 when p is shorter than 128, narrow only) in registers as they
// are loaded; nothing is stored.

// FOLD folds lane A (scratch T) forward by the distance whose constants
// are in X0 and adds data block D: A = lo(A)*lo(X0) ^ hi(A)*hi(X0) ^ D.
#define FOLD(A, T, D) \
	MOVOA     A, T; \
	PCLMULQDQ $0x00, X0, A; \
	PCLMULQDQ $0x11, X0, T; \
	PXOR      D, A; \
	PXOR      T, A

// LOAD4 loads the 64 bytes at off(SI) into X9..X12.
#define LOAD4(off) \
	MOVOU off+0(SI), X9; \
	MOVOU off+16(SI), X10; \
	MOVOU off+32(SI), X11; \
	MOVOU off+48(SI), X12

// MASK4 ORs the 64 mask bytes at off(DX) into X9..X12 (X13..X15 and X5
// scratch).
#define MASK4(off) \
	MOVOU off+0(DX), X13; \
	MOVOU off+16(DX), X14; \
	MOVOU off+32(DX), X15; \
	MOVOU off+48(DX), X5; \
	POR   X13, X9; \
	POR   X14, X10; \
	POR   X15, X11; \
	POR   X5, X12

// FOLD4 folds the four lanes onto X9..X12.
#define FOLD4 \
	FOLD(X1, X5, X9); \
	FOLD(X2, X6, X10); \
	FOLD(X3, X7, X11); \
	FOLD(X4, X8, X12)

// ZFOLD folds zmm lane group A (scratch T) forward by the distance whose
// constants are in every quarter of Z0 and adds D.
#define ZFOLD(A, T, D) \
	VPCLMULQDQ $0x11, Z0, A, T; \
	VPCLMULQDQ $0x00, Z0, A, A; \
	VPTERNLOGD $0x96, D, T, A

// REDUCE leaves in AX the raw CRC-32 state X1 stands for (the message
// so far, congruent to it modulo P): X1 folded to 64 bits with the
// 128-bit step's x^64 constant still in X0, then a Barrett reduction
// (x^64 mod P, then the bit-reflected P and floor(x^64 / P) at icrcK+48
// and +64), as hash/crc32's amd64 code ends.
#define REDUCE \
	PCMPEQB   X3, X3; \
	PCLMULQDQ $1, X1, X0; \
	PSRLDQ    $8, X1; \
	PXOR      X0, X1; \
	MOVOA     X1, X2; \
	MOVQ      ·icrcK+48(SB), X0; \
	PSRLQ     $32, X3; \
	PSRLDQ    $4, X2; \
	PAND      X3, X1; \
	PCLMULQDQ $0, X0, X1; \
	PXOR      X2, X1; \
	MOVOU     ·icrcK+64(SB), X0; \
	MOVOA     X1, X2; \
	PAND      X3, X1; \
	PCLMULQDQ $0x10, X0, X1; \
	PAND      X3, X1; \
	PCLMULQDQ $0, X0, X1; \
	PXOR      X2, X1; \
	PEXTRD    $1, X1, AX

// func icrcFold(c uint32, p []byte, mk *icrcMask, wide bool) uint32
TEXT ·icrcFold(SB), NOSPLIT, $0-52
	MOVQ p_base+8(FP), SI
	MOVQ p_len+16(FP), CX
	MOVQ mk+32(FP), DX
	CMPB wide+40(FP), $0
	JNE  wide

	// Block 0, masked, the state c added to its first 4 bytes.
	LOAD4(0)
	MASK4(0)
	MOVL  c+0(FP), X13
	PXOR  X13, X9
	MOVOA X9, X1
	MOVOA X10, X2
	MOVOA X11, X3
	MOVOA X12, X4
	ADDQ  $64, SI
	SUBQ  $64, CX
	MOVOU ·icrcK+0(SB), X0
	CMPQ  CX, $64
	JB    lanes

	// Block 1, masked.
	LOAD4(0)
	MASK4(64)
	FOLD4
	ADDQ  $64, SI
	SUBQ  $64, CX

loop64:
	CMPQ CX, $64
	JB   lanes
	LOAD4(0)
	FOLD4
	ADDQ $64, SI
	SUBQ $64, CX
	JMP  loop64

wide:
	// Blocks 0..3 (256 bytes), the first two masked, the state c added.
	VMOVDQU64 0(SI), Z1
	VMOVDQU64 64(SI), Z2
	VMOVDQU64 128(SI), Z3
	VMOVDQU64 192(SI), Z4
	VPORQ     0(DX), Z1, Z1
	VPORQ     64(DX), Z2, Z2
	MOVL      c+0(FP), AX
	VMOVD     AX, X13
	VPXORQ    Z13, Z1, Z1
	ADDQ      $256, SI
	SUBQ      $256, CX

	VBROADCASTI32X4 ·icrcK+32(SB), Z0

wloop256:
	CMPQ      CX, $256
	JB        wfold
	VMOVDQU64 0(SI), Z9
	VMOVDQU64 64(SI), Z10
	VMOVDQU64 128(SI), Z11
	VMOVDQU64 192(SI), Z12
	ZFOLD(Z1, Z5, Z9)
	ZFOLD(Z2, Z6, Z10)
	ZFOLD(Z3, Z7, Z11)
	ZFOLD(Z4, Z8, Z12)
	ADDQ      $256, SI
	SUBQ      $256, CX
	JMP       wloop256

wfold:
	// Fold Z1 onto Z2, Z2 onto Z3, Z3 onto Z4, by 512 bits.
	VBROADCASTI32X4 ·icrcK+0(SB), Z0
	ZFOLD(Z1, Z5, Z2)
	ZFOLD(Z1, Z5, Z3)
	ZFOLD(Z1, Z5, Z4)

wloop64:
	CMPQ      CX, $64
	JB        wsplit
	VMOVDQU64 0(SI), Z9
	ZFOLD(Z1, Z5, Z9)
	ADDQ      $64, SI
	SUBQ      $64, CX
	JMP       wloop64

wsplit:
	VEXTRACTI32X4 $3, Z1, X4
	VEXTRACTI32X4 $2, Z1, X3
	VEXTRACTI32X4 $1, Z1, X2
	VZEROUPPER

lanes:
	// Fold X1 onto X2, X2 onto X3, X3 onto X4, by 128 bits.
	MOVOU ·icrcK+16(SB), X0
	FOLD(X1, X5, X2)
	FOLD(X1, X5, X3)
	FOLD(X1, X5, X4)

loop16:
	CMPQ  CX, $16
	JB    done
	MOVOU (SI), X9
	FOLD(X1, X5, X9)
	ADDQ  $16, SI
	SUBQ  $16, CX
	JMP   loop16

done:
	REDUCE
	MOVL AX, ret+48(FP)
	RET

// STORE4 stores X9..X12 at off(DI): the loaded bytes, unmasked.
#define STORE4(off) \
	MOVOU X9, off+0(DI); \
	MOVOU X10, off+16(DI); \
	MOVOU X11, off+32(DI); \
	MOVOU X12, off+48(DI)

// icrcFoldCopy is icrcFold without a mask that also stores every block
// it loads from src at the same offset of dst: the copy and the CRC in
// one read of src. The CRC covers the values loaded, so it matches what
// was stored even if src changes meanwhile.
//
// func icrcFoldCopy(c uint32, dst, src []byte, wide bool) uint32
TEXT ·icrcFoldCopy(SB), NOSPLIT, $0-68
	MOVQ dst_base+8(FP), DI
	MOVQ src_base+32(FP), SI
	MOVQ src_len+40(FP), CX
	CMPB wide+56(FP), $0
	JNE  cwide

	// Block 0, the state c added to its first 4 bytes after the store.
	LOAD4(0)
	STORE4(0)
	MOVL  c+0(FP), X13
	PXOR  X13, X9
	MOVOA X9, X1
	MOVOA X10, X2
	MOVOA X11, X3
	MOVOA X12, X4
	ADDQ  $64, SI
	ADDQ  $64, DI
	SUBQ  $64, CX
	MOVOU ·icrcK+0(SB), X0

cloop64:
	CMPQ CX, $64
	JB   clanes
	LOAD4(0)
	STORE4(0)
	FOLD4
	ADDQ $64, SI
	ADDQ $64, DI
	SUBQ $64, CX
	JMP  cloop64

cwide:
	// Blocks 0..3 (256 bytes), stored, then the state c added.
	VMOVDQU64 0(SI), Z1
	VMOVDQU64 64(SI), Z2
	VMOVDQU64 128(SI), Z3
	VMOVDQU64 192(SI), Z4
	VMOVDQU64 Z1, 0(DI)
	VMOVDQU64 Z2, 64(DI)
	VMOVDQU64 Z3, 128(DI)
	VMOVDQU64 Z4, 192(DI)
	MOVL      c+0(FP), AX
	VMOVD     AX, X13
	VPXORQ    Z13, Z1, Z1
	ADDQ      $256, SI
	ADDQ      $256, DI
	SUBQ      $256, CX

	VBROADCASTI32X4 ·icrcK+32(SB), Z0

cwloop256:
	CMPQ      CX, $256
	JB        cwfold
	VMOVDQU64 0(SI), Z9
	VMOVDQU64 64(SI), Z10
	VMOVDQU64 128(SI), Z11
	VMOVDQU64 192(SI), Z12
	VMOVDQU64 Z9, 0(DI)
	VMOVDQU64 Z10, 64(DI)
	VMOVDQU64 Z11, 128(DI)
	VMOVDQU64 Z12, 192(DI)
	ZFOLD(Z1, Z5, Z9)
	ZFOLD(Z2, Z6, Z10)
	ZFOLD(Z3, Z7, Z11)
	ZFOLD(Z4, Z8, Z12)
	ADDQ      $256, SI
	ADDQ      $256, DI
	SUBQ      $256, CX
	JMP       cwloop256

cwfold:
	VBROADCASTI32X4 ·icrcK+0(SB), Z0
	ZFOLD(Z1, Z5, Z2)
	ZFOLD(Z1, Z5, Z3)
	ZFOLD(Z1, Z5, Z4)

cwloop64:
	CMPQ      CX, $64
	JB        cwsplit
	VMOVDQU64 0(SI), Z9
	VMOVDQU64 Z9, 0(DI)
	ZFOLD(Z1, Z5, Z9)
	ADDQ      $64, SI
	ADDQ      $64, DI
	SUBQ      $64, CX
	JMP       cwloop64

cwsplit:
	VEXTRACTI32X4 $3, Z1, X4
	VEXTRACTI32X4 $2, Z1, X3
	VEXTRACTI32X4 $1, Z1, X2
	VZEROUPPER

clanes:
	MOVOU ·icrcK+16(SB), X0
	FOLD(X1, X5, X2)
	FOLD(X1, X5, X3)
	FOLD(X1, X5, X4)

cloop16:
	CMPQ  CX, $16
	JB    cdone
	MOVOU (SI), X9
	MOVOU X9, (DI)
	FOLD(X1, X5, X9)
	ADDQ  $16, SI
	ADDQ  $16, DI
	SUBQ  $16, CX
	JMP   cloop16

cdone:
	REDUCE
	MOVL AX, ret+64(FP)
	RET

// icrcShort is the CRC of a short buffer, optionally after a pseudo
// header: one lane, 16 bytes a step (FOLD by 128 bits), so that a packet
// of a few blocks costs a few multiplies and no lane set-up. The header
// blocks are read as two 8-byte words each (the caller has just stored
// them as such: one 16-byte load would wait for both stores), the state
// c added to the first block. The body is OR-ed with the mask block by
// block. A tail of r = 1..15 bytes is taken as in Intel's paper: the
// lane X1 (16 bytes) and the tail make 16+r bytes, whose last 16 bytes
// are lane bytes r..15 followed by the tail (the tail loaded as the last
// 16 bytes of the buffer, masked, and blended in), and whose first r
// bytes, zero-extended in front to a block, fold onto them by 128 bits.
//
// func icrcShort(c uint32, h *pseudoHdr, nh int, p []byte, mk *icrcMask) uint32
TEXT ·icrcShort(SB), NOSPLIT, $0-60
	MOVQ  h+8(FP), DI
	MOVQ  nh+16(FP), BX
	MOVQ  p_base+24(FP), SI
	MOVQ  p_len+32(FP), CX
	MOVQ  mk+48(FP), DX
	MOVL  c+0(FP), X2
	MOVOU ·icrcK+16(SB), X0
	MOVQ  CX, R9
	ANDQ  $~15, R9               // R9: the whole blocks of p
	TESTQ BX, BX
	JZ    sbody0

	// Header block 0, the state added to its first 4 bytes, then the
	// others (R8 their offset, BX their end).
	MOVQ   0(DI), X1
	PINSRQ $1, 8(DI), X1
	PXOR   X2, X1
	SHLQ   $4, BX
	MOVQ   $16, R8
	CMPQ   R8, BX
	JAE    shead

shloop:
	MOVQ   (DI)(R8*1), X9
	PINSRQ $1, 8(DI)(R8*1), X9
	FOLD(X1, X5, X9)
	ADDQ   $16, R8
	CMPQ   R8, BX
	JB     shloop

shead:
	XORL R8, R8                  // R8: offset in p
	JMP  sbody

sbody0:
	// No header: body block 0, masked, the state added.
	MOVOU (SI), X1
	MOVOU (DX), X9
	POR   X9, X1
	PXOR  X2, X1
	MOVQ  $16, R8

sbody:
	CMPQ R8, R9
	JAE  stail

sloop:
	MOVOU (SI)(R8*1), X9
	MOVOU (DX)(R8*1), X10
	POR   X10, X9
	FOLD(X1, X5, X9)
	ADDQ  $16, R8
	CMPQ  R8, R9
	JB    sloop

stail:
	SUBQ R9, CX                  // CX: the tail's length r
	JZ   sdone

	// The last 16 bytes of p, masked: the tail is their last r.
	ADDQ     R9, SI
	ADDQ     R9, DX
	MOVOU    -16(SI)(CX*1), X9
	MOVOU    -16(DX)(CX*1), X10
	POR      X10, X9
	LEAQ     ·icrcShuf(SB), AX
	MOVOU    (AX)(CX*1), X0
	MOVOU    32(AX)(CX*1), X3
	MOVOA    X1, X2
	PSHUFB   X0, X2
	PBLENDVB X0, X9, X2
	PSHUFB   X3, X1
	MOVOU    ·icrcK+16(SB), X0
	FOLD(X1, X5, X2)

sdone:
	REDUCE
	MOVL AX, ret+56(FP)
	RET
