package link

import "golang.org/x/sys/unix"

// Steering of received datagrams to workers without privileges: the N
// sockets of a UDP link form one SO_REUSEPORT group, socket i bound i-th
// and therefore at index i of the group (reuseport_add_sock appends), and
// a classic BPF program attached with SO_ATTACH_REUSEPORT_CBPF picks the
// index. Classic BPF needs no capability (eBPF reuseport programs need
// CAP_BPF or CAP_SYS_ADMIN).
//
// For UDP the kernel runs the program with the skb data pulled past the
// UDP header (udp4_lib_lookup2 / udp6_lib_lookup2 pass hdr_len =
// sizeof(struct udphdr) to reuseport_select_sock; run_bpf_filter does
// pskb_pull(skb, hdr_len)): absolute loads are offsets into the UDP
// payload, the BTH at 0, and "len" is the payload length. A load beyond
// the data ends the program with return value 0. A return value >= the
// number of sockets makes the kernel fall back to its own hash
// (reuseport_select_sock_by_hash), which would mis-steer; the program
// always returns hash % N < N, so that never happens.
//
// The program computes roce.SteerQueue(destQPN, N):
//
//	0: ld   len                  A = UDP payload length
//	1: jge  #16, 2, 8            shorter than BTH + ICRC: socket 0
//	2: ld   [4]                  A = BTH bytes 4..7, big-endian
//	3: and  #0xffffff            destination QP
//	4: mul  #0x9e3779b1          32-bit multiply (classic BPF ALU is 32-bit)
//	5: rsh  #16                  = roce.SteerHash(qpn)
//	6: mod  #N                   = roce.SteerQueue(qpn, N)
//	7: ret  a
//	8: ret  #0

// udpSteerMul is the multiplier of roce.SteerHash; a test checks the
// program's arithmetic against roce.SteerHash for every 24-bit QPN.
const udpSteerMul = 0x9E3779B1

// udpSteerProgram returns the steering program for n sockets (n >= 1).
func udpSteerProgram(n int) []unix.SockFilter {
	return []unix.SockFilter{
		{Code: unix.BPF_LD | unix.BPF_W | unix.BPF_LEN},
		{Code: unix.BPF_JMP | unix.BPF_JGE | unix.BPF_K, Jt: 0, Jf: 6, K: udpMinPayload},
		{Code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, K: 4},
		{Code: unix.BPF_ALU | unix.BPF_AND | unix.BPF_K, K: 0xffffff},
		{Code: unix.BPF_ALU | unix.BPF_MUL | unix.BPF_K, K: udpSteerMul},
		{Code: unix.BPF_ALU | unix.BPF_RSH | unix.BPF_K, K: 16},
		{Code: unix.BPF_ALU | unix.BPF_MOD | unix.BPF_K, K: uint32(n)},
		{Code: unix.BPF_RET | unix.BPF_A},
		{Code: unix.BPF_RET | unix.BPF_K, K: 0},
	}
}

// attachSteering attaches the program for n sockets to the reuseport
// group of fd (any member: the program belongs to the group).
func attachSteering(fd int, n int) error {
	prog := udpSteerProgram(n)
	return unix.SetsockoptSockFprog(fd, unix.SOL_SOCKET, unix.SO_ATTACH_REUSEPORT_CBPF,
		&unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]})
}
