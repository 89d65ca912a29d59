package dataplane

import (
	"errors"

	"github.com/vrnic/vrnic/device"
	"github.com/vrnic/vrnic/device/engine"
	"github.com/vrnic/vrnic/dma"
)

var _ device.XRCDataPlane = (*DataPlane)(nil)

// AddXRCSRQ implements device.XRCDataPlane: the SRQ's receive source, a
// receive sink on its CQ and its PD's memory (one accessor per engine
// worker: any target QP may name it) go into the engine's XRC table.
func (dp *DataPlane) AddXRCSRQ(s *device.SRQ) error {
	num, xrcd, cq, ok := s.XRC()
	if !ok {
		return errors.New("dataplane: not an XRC SRQ")
	}
	dp.mu.Lock()
	defer dp.mu.Unlock()
	if dp.closed {
		return errors.New("dataplane: closed")
	}
	page := s.Doorbells()
	rq, err := dp.srqSourceLocked(s, page)
	if err != nil {
		return err
	}
	sink, err := dp.cqSinkLocked(cq, page)
	if err != nil {
		delete(dp.srqs, s)
		return err
	}
	x := &engine.XRCSRQ{XRCD: xrcd, RQ: rq, CQ: &qpSink{cq: sink, recv: true}}
	pd := dma.PD{Owner: s.Owner(), Handle: s.PDHandle()}
	for _, acc := range dp.accs {
		x.Mems = append(x.Mems, &qpMemory{acc: acc, pd: pd, mem: dp.space})
	}
	dp.eng.AddXRCSRQ(num, x)
	return nil
}

// RemoveXRCSRQ implements device.XRCDataPlane.
func (dp *DataPlane) RemoveXRCSRQ(s *device.SRQ) <-chan struct{} {
	num, _, _, ok := s.XRC()
	if !ok {
		return nil
	}
	return dp.eng.RemoveXRCSRQ(num)
}
