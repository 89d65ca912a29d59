// # TAP link
//
// NewTAP attaches a device to a multi-queue TAP device (package tap): port
// i reads and writes queue i for engine worker i. The eBPF steering
// program attached to the device (package ebpf) puts every received RoCE
// v2 frame on the queue of the worker that owns its destination QP
// (roce.SteerQueue), the same function the engine uses, so a port only
// ever sees frames for its own QPs; a frame for another queue's QP is
// counted (RxMisqueued) and dropped. ARP and neighbour discovery frames,
// on any queue, go to the device's neighbour engine (tap.Neighbors), not
// to the engine; anything else is counted (RxOther) and dropped.
//
// Frames are whole Ethernet frames in both directions, exactly as the
// engine builds and parses them: the kernel side of the TAP is a bridge
// port or a host interface, and nothing is synthesized.
//
// Receive: RecvBatch reads the queue itself, non-blocking, into the
// worker's own buffers, classifies what it read and returns the RoCE
// frames; a waiter goroutine per queue watches the queue only while the
// worker sleeps (ArmReady, see TAPPort).
// Send: SendBatch writes the caller's frames (the kernel copies); a frame
// the kernel refuses is counted and dropped so that it cannot stall the
// worker. Neither path allocates.
//
// With the device's UDP segmentation offload (tap.Device.Offload, on by
// default) a run of frames to one QP goes as one segmented write and a
// read may return a whole run, which the port splits into frames with the
// headers the kernel's segmentation would have written (tap_gso.go,
// kernel-notes/tap-offload.md). Without it, one write and one read per
// frame.
//
// The link owns the device: Close stops the waiters and closes the
// device, which removes the interface (and the programs attached to it).
package link
