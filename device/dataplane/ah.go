package dataplane

import (
	"fmt"

	"github.com/vrnic/vrnic/device"
	"github.com/vrnic/vrnic/device/engine"
)

// Address handles.
//
// Every context with an AH or a UD QP has one engine.AHTable, shared by
// its UD QPs: CREATE_AH builds the engine's AH (its path, with the
// link's fix-up applied) and publishes it in the table, DESTROY_AH
// removes it; the engine's workers look handles up without a lock. The
// table lives as long as an AH or a UD QP of the context refers to it.
//
// On a link that addresses peers by MAC (TAP), CREATE_AH resolves the
// destination first (Config.Resolve: ARP or neighbour discovery, bounded
// by ResolveTimeout, under the device lock as for an RC QP's RTR) and
// fails with EHOSTUNREACH if nobody answers, as the kernel's
// ib_create_ah does for a RoCE destination it cannot resolve; the MAC is
// then fixed in the AH. On the UDP and in-memory links any destination is
// accepted: a UD send to a GID nobody has completes successfully (UD is
// unreliable) and the datagram is lost.

// ahTable is a context's table and how many AHs and UD QPs use it.
type ahTable struct {
	t    engine.AHTable
	refs int
}

func (a *ahTable) ref() *engine.AHTable {
	a.refs++
	return &a.t
}

// ahTableLocked returns the table of owner's context, creating it.
func (dp *DataPlane) ahTableLocked(owner device.Owner) *ahTable {
	t := dp.ahs[owner]
	if t == nil {
		t = &ahTable{}
		dp.ahs[owner] = t
	}
	return t
}

// unrefAHTableLocked drops one reference to owner's table.
func (dp *DataPlane) unrefAHTableLocked(owner device.Owner) {
	if t := dp.ahs[owner]; t != nil {
		if t.refs--; t.refs <= 0 {
			delete(dp.ahs, owner)
		}
	}
}

// AddAH implements device.DataPlane.
func (dp *DataPlane) AddAH(a *device.AH) error {
	local, remote := a.Path()
	if err := dp.resolve(fmt.Sprintf("AH %d", a.Handle()), remote); err != nil {
		return err
	}
	at := a.Attr()
	ah, err := dp.eng.NewAH(engine.AHAttr{PD: a.PDHandle(), Local: local, Remote: remote,
		FlowLabel: at.FlowLabel, TrafficClass: at.TrafficClass, HopLimit: at.HopLimit, SL: at.SL})
	if err != nil {
		return err
	}
	dp.mu.Lock()
	defer dp.mu.Unlock()
	t := dp.ahTableLocked(a.Owner())
	t.ref().Set(a.Handle(), ah)
	return nil
}

// RemoveAH implements device.DataPlane.
func (dp *DataPlane) RemoveAH(a *device.AH) {
	dp.mu.Lock()
	defer dp.mu.Unlock()
	if t := dp.ahs[a.Owner()]; t != nil {
		t.t.Delete(a.Handle())
		dp.unrefAHTableLocked(a.Owner())
	}
}
