package ibverbs

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vrnic/vrnic/internal/testenv"
)

// rsWireProg prints the layout of src/cma_rsocket.h's wire structures,
// one encoded connection private data and the immediates the library
// sends, for TestRsocketWireGolden.
const rsWireProg = `#include <stddef.h>
#include <stdio.h>
#include "cma_rsocket.h"

#define OFF(t, f) printf(#t "." #f " %zu %zu\n", offsetof(struct t, f), sizeof(((struct t *)0)->f))

int main(void) {
	printf("sizeof rs_conn_data %zu\n", sizeof(struct rs_conn_data));
	printf("sizeof rs_sge %zu\n", sizeof(struct rs_sge));
	printf("sizeof rs_iomap %zu\n", sizeof(struct rs_iomap));
	OFF(rs_conn_data, version);
	OFF(rs_conn_data, flags);
	OFF(rs_conn_data, credits);
	OFF(rs_conn_data, reserved);
	OFF(rs_conn_data, target_iomap_size);
	OFF(rs_conn_data, target_sgl);
	OFF(rs_conn_data, data_buf);
	OFF(rs_sge, addr);
	OFF(rs_sge, key);
	OFF(rs_sge, length);
	OFF(rs_iomap, offset);
	OFF(rs_iomap, sge);
	struct rs_conn_data c;
	rs_conn_data_put(&c, 384, 1024, 0x1122334455667788ull, 0xaabbccddu, 0x0102030405060708ull, 0x11223344u, 65536);
	printf("conn_data ");
	for (size_t i = 0; i < sizeof c; i++)
		printf("%02x", ((unsigned char *)&c)[i]);
	printf("\n");
	uint32_t imm[] = {
		RS_MSG_SET(RS_OP_DATA, 65536), RS_MSG_SET(RS_OP_DATA, 0x1fffffff), RS_MSG_SET(RS_OP_WRITE, 4096),
		RS_MSG_SET(RS_OP_SGL, 384 + 7), RS_MSG_SET(RS_OP_IOMAP_SGL, 3), RS_MSG_SET(RS_OP_CTRL, RS_CTRL_DISCONNECT),
		RS_MSG_SET(RS_OP_CTRL, RS_CTRL_KEEPALIVE), RS_MSG_SET(RS_OP_CTRL, RS_CTRL_SHUTDOWN),
	};
	for (size_t i = 0; i < sizeof imm / sizeof imm[0]; i++) {
		uint32_t be = htobe32(imm[i]);
		printf("imm %08x op %u data %u wire ", imm[i], RS_MSG_OP(imm[i]), RS_MSG_DATA(imm[i]));
		for (int j = 0; j < 4; j++)
			printf("%02x", ((unsigned char *)&be)[j]);
		printf("\n");
	}
	int scale[] = { 1, 128, 129, 256, 1024, 32767 };
	for (size_t i = 0; i < sizeof scale / sizeof scale[0]; i++)
		printf("scale %d %d %d\n", scale[i], rs_value_to_scale(scale[i], 8),
		       rs_scale_to_value(rs_value_to_scale(scale[i], 8), 8));
	printf("consts %d %d %d %d %d\n", RS_SGL_SIZE, RS_QP_CTRL_SIZE, RS_SNDLOWAT, RS_OLAP_START_SIZE, RS_MAX_TRANSFER);
	return 0;
}
`

// TestRsocketWireGolden checks vrnic's rsockets wire format against the
// protocol of librdmacm's rsocket.c, from which these values are derived
// by hand (there is no RDMA device here to check interoperability live):
//
//   - struct rs_conn_data, the CM private data of the REQ and the REP, is
//     40 bytes: version (1 byte) at 0, flags at 1 (RS_CONN_FLAG_IOMAP 2,
//     RS_CONN_FLAG_NET 1 on big-endian hosts), credits (big-endian 16
//     bits: the RQ size) at 2, 3 reserved bytes, target_iomap_size (the
//     8-bit scale of the iomap entry count) at 7, then the target SGL and
//     the data buffer, each a struct rs_sge of addr (8), key (4), length
//     (4), all big-endian; the target SGL's length is RS_SGL_SIZE (2)
//     entries and the data buffer's the first half of the receive buffer.
//   - struct rs_iomap is an 8-byte offset and an rs_sge: 24 bytes.
//   - The immediate of RDMA WRITE WITH IMMEDIATE is big-endian on the wire;
//     bits 31:29 are the op (DATA 0, WRITE 2, SGL 4, IOMAP_SGL 6, CTRL 7),
//     bits 28:0 the value (bytes, credits, iomap index, or DISCONNECT 0,
//     KEEPALIVE 1, SHUTDOWN 2).
//   - Sizes scale to 8 bits as value <= 128 ? value : 128 | value>>8
//     (so 129 travels as 128 and comes back 128: rounded down).
func TestRsocketWireGolden(t *testing.T) {
	cc := testenv.NeedTool(t, "cc")
	tmp := t.TempDir()
	src := filepath.Join(tmp, "wire.c")
	require.NoError(t, os.WriteFile(src, []byte(rsWireProg), 0o644))
	bin := filepath.Join(tmp, "wire")
	out, err := exec.Command(cc, "-std=gnu11", "-Wall", "-Wextra", "-Werror", "-Isrc", src, "-o", bin).CombinedOutput()
	require.NoError(t, err, "%s", out)
	out, err = exec.Command(bin).CombinedOutput()
	require.NoError(t, err, "%s", out)
	want := `sizeof rs_conn_data 40
sizeof rs_sge 16
sizeof rs_iomap 24
rs_conn_data.version 0 1
rs_conn_data.flags 1 1
rs_conn_data.credits 2 2
rs_conn_data.reserved 4 3
rs_conn_data.target_iomap_size 7 1
rs_conn_data.target_sgl 8 16
rs_conn_data.data_buf 24 16
rs_sge.addr 0 8
rs_sge.key 8 4
rs_sge.length 12 4
rs_iomap.offset 0 8
rs_iomap.sge 8 16
` +
		// version 1, flags IOMAP (little-endian host), credits 384 =
		// 0x0180, reserved, iomap 1024 -> 128|4 = 0x84; target SGL
		// addr, key, length 2; data buffer addr, key, length 65536.
		"conn_data " + strings.Join([]string{"01", "02", "0180", "000000", "84",
		"1122334455667788", "aabbccdd", "00000002",
		"0102030405060708", "11223344", "00010000"}, "") + "\n" +
		`imm 00010000 op 0 data 65536 wire 00010000
imm 1fffffff op 0 data 536870911 wire 1fffffff
imm 40001000 op 2 data 4096 wire 40001000
imm 80000187 op 4 data 391 wire 80000187
imm c0000003 op 6 data 3 wire c0000003
imm e0000000 op 7 data 0 wire e0000000
imm e0000001 op 7 data 1 wire e0000001
imm e0000002 op 7 data 2 wire e0000002
scale 1 1 1
scale 128 128 128
scale 129 128 128
scale 256 129 256
scale 1024 132 1024
scale 32767 255 32512
consts 2 4 2048 2048 65536
`
	assert.Equal(t, want, string(out))
}
