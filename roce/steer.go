package roce

// Queue steering: the one definition of which worker owns a QP.
//
// A QP belongs to worker SteerQueue(qpn, n) for its whole life. The engine
// uses this function to place QPs on workers, and the eBPF steering program
// attached to the TAP device (ebpf/steer.c) computes SteerHash over the BTH
// destination QP of every received frame; the kernel then takes the result
// modulo the number of TAP queues. A test in ebpf/ checks that the program
// and this function agree.

// steerMul is the 32-bit golden-ratio multiplier (Knuth's multiplicative
// hash); it spreads consecutive QPNs over the workers.
const steerMul = 0x9E3779B1

// SteerHash is the steering hash of a 24-bit QP number.
func SteerHash(qpn uint32) uint32 {
	return ((qpn & 0xffffff) * steerMul) >> 16
}

// SteerQueue returns the worker (and TAP queue) that owns qpn among n
// workers. n must be at least 1.
func SteerQueue(qpn uint32, n int) int {
	return int(SteerHash(qpn) % uint32(n))
}
