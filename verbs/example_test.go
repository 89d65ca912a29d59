package verbs_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/device/devicetest"
	"github.com/vrnic/vrnic/verbs"
)

// This example opens a context on a device served in-process on a real
// control socket (devicetest; a client of vrnicd would pass the daemon's
// socket path instead), registers memory and brings an RC QP to RTS.
func Example() {
	srv, err := devicetest.Start(devicetest.Options{})
	if err != nil {
		panic(err)
	}
	defer srv.Close()

	ctx, err := verbs.Open(srv.SocketPath, verbs.WithClientName("example"))
	if err != nil {
		panic(err)
	}
	defer ctx.Close()
	port, _ := ctx.QueryPort(1)
	fmt.Println("port active:", port.State == 4, "MTU", port.ActiveMTU.Bytes())

	pd, _ := ctx.AllocPD()
	buf, _ := ctx.Alloc(64<<10, 4096)
	mr, _ := pd.RegMR(buf, abi.AccessLocalWrite|abi.AccessRemoteWrite)
	fmt.Println("MR length:", mr.Length, "remote key:", mr.RKey != 0)

	cq, _ := ctx.CreateCQ(128, nil)
	qp, _ := pd.CreateQP(verbs.QPInitAttr{Type: abi.QPTRC, SendCQ: cq, RecvCQ: cq,
		Cap: abi.QPCap{MaxSendWR: 64, MaxRecvWR: 64, MaxSendSGE: 1, MaxRecvSGE: 1}})
	peer := abi.AHAttr{DGID: [16]byte{10: 0xff, 11: 0xff, 12: 127, 15: 2}, PortNum: 1}
	steps := []func() error{
		func() error { return qp.ToInit(abi.AccessRemoteWrite, 0) },
		func() error {
			return qp.ToRTR(verbs.RTRAttr{AV: peer, PathMTU: abi.MTU4096, DestQPN: 0x12, RQPSN: 100, MaxDestRdAtomic: 1, MinRNRTimer: 12})
		},
		func() error {
			return qp.ToRTS(verbs.RTSAttr{SQPSN: 200, Timeout: 14, RetryCnt: 7, RNRRetry: 7, MaxRdAtomic: 1})
		},
	}
	for _, step := range steps {
		if err := step(); err != nil {
			panic(err)
		}
		q, _ := qp.Query()
		fmt.Println("QP state:", q.Attr.QPState)
	}
	// Skipping a step is refused with EINVAL and a message.
	qp2, _ := pd.CreateQP(verbs.QPInitAttr{Type: abi.QPTRC, SendCQ: cq, RecvCQ: cq, Cap: abi.QPCap{MaxSendWR: 1, MaxRecvWR: 1}})
	err = qp2.ToRTS(verbs.RTSAttr{})
	var ce *abi.ControlError
	if errors.As(err, &ce) {
		fmt.Println(ce.Errno, "-", ce.Msg)
	}
	// Output:
	// port active: true MTU 4096
	// MR length: 65536 remote key: true
	// QP state: INIT
	// QP state: RTR
	// QP state: RTS
	// invalid argument - illegal QP state transition RESET -> RTS for RC QP
}

// This example posts a send and polls the CQ. The WQE goes straight into
// the ring in shared memory and the doorbell record; the daemon's transport
// engine consumes it. The in-process device of this example has no engine,
// so no completion arrives: Poll returns 0 and an armed CQ's channel stays
// quiet until the deadline.
func ExampleQP_PostSend() {
	srv, _ := devicetest.Start(devicetest.Options{})
	defer srv.Close()
	ctx, _ := verbs.Open(srv.SocketPath)
	defer ctx.Close()
	pd, _ := ctx.AllocPD()
	buf, _ := ctx.Alloc(4096, 4096)
	mr, _ := pd.RegMR(buf, abi.AccessLocalWrite)
	ch, _ := verbs.NewCompChannel()
	defer ch.Close()
	cq, _ := ctx.CreateCQ(16, ch)
	qp, _ := pd.CreateQP(verbs.QPInitAttr{Type: abi.QPTUD, SendCQ: cq, RecvCQ: cq,
		Cap: abi.QPCap{MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 1, MaxRecvSGE: 1}})
	qp.ToInit(0, 0x1234)
	qp.ToRTR(verbs.RTRAttr{})
	qp.ToRTS(verbs.RTSAttr{SQPSN: 1})
	ah, _ := pd.CreateAH(abi.AHAttr{DGID: [16]byte{10: 0xff, 11: 0xff, 12: 127, 15: 2}, PortNum: 1})

	copy(buf.Bytes, "hello")
	sge := []abi.SGE{mr.SGE(0, 5)}
	err := qp.PostSend(&verbs.SendWR{WrID: 1, Opcode: abi.WRSend, Flags: abi.SendSignaled, SGL: sge,
		AH: ah, RemoteQPN: 0x99, RemoteQKey: 0x1234})
	fmt.Println("posted:", err == nil)

	wc := make([]abi.CQE, 4)
	fmt.Println("completions:", cq.Poll(wc))
	cq.ReqNotify(false)
	wctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	_, err = ch.Wait(wctx)
	fmt.Println("event:", errors.Is(err, verbs.ErrTimeout))
	// Output:
	// posted: true
	// completions: 0
	// event: true
}
