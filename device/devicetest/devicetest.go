// Package devicetest runs a vrnic device in-process on a real control
// socket, for tests and runnable examples of client code: clients talk to
// it exactly as they would to vrnicd (SOCK_SEQPACKET, SCM_RIGHTS, shared
// memory), only the daemon shares the test's process.
//
// By default the device has no data plane: QPs move through their states
// and clients can post work, but no data moves and no completion is
// produced (Options.DataPlane plugs one in).
package devicetest

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/admin"
	"github.com/vrnic/vrnic/device"
	"github.com/vrnic/vrnic/dma"
)

// Server is an in-process device serving a control socket.
type Server struct {
	Device     *device.Device
	SocketPath string
	Space      *dma.Space
	dir        string
	done       chan error
}

// Options tune Start; the zero value is a device "test0" with default
// limits, one GID (::ffff:127.0.0.1) and logging discarded.
type Options struct {
	Name   string
	Limits device.Limits
	Logger *slog.Logger
	// DataPlane: nil for none (QPs move through their states, no data
	// moves, no completion is produced).
	DataPlane device.DataPlane
	// Faults serves the fault-rule commands (device.Config.Faults); nil:
	// none.
	Faults func(admin.FaultRequest) (admin.FaultReply, error)
	// MaxRdAtomic is device.Config.MaxRdAtomic (0: the default, 16).
	MaxRdAtomic uint8
	// NoECE is device.Config.NoECE: the device supports no ECE option.
	NoECE bool
}

// Start creates a device listening on a socket in a new temporary
// directory.
func Start(o Options) (*Server, error) {
	if o.Name == "" {
		o.Name = "test0"
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	dir, err := os.MkdirTemp("", "vrnic-devicetest-")
	if err != nil {
		return nil, err
	}
	space, err := dma.NewSpace(dma.Config{Logger: o.Logger})
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	gid := [16]byte{10: 0xff, 11: 0xff, 12: 127, 15: 1}
	d, err := device.New(device.Config{
		Name:      o.Name,
		Link:      device.LinkInfo{Type: abi.LinkMem, MaxMTU: abi.MTU4096, GIDs: [][16]byte{gid}, SpeedMbps: 10000},
		Limits:    o.Limits,
		Space:     space,
		DataPlane: o.DataPlane,
		Logger:    o.Logger,
		Faults:    o.Faults,

		MaxRdAtomic: o.MaxRdAtomic,
		NoECE:       o.NoECE,
	})
	if err != nil {
		space.Close()
		os.RemoveAll(dir)
		return nil, err
	}
	path := filepath.Join(dir, o.Name+admin.SocketSuffix)
	l, err := admin.Listen(path)
	if err != nil {
		space.Close()
		os.RemoveAll(dir)
		return nil, fmt.Errorf("devicetest: %w", err)
	}
	s := &Server{Device: d, SocketPath: path, Space: space, dir: dir, done: make(chan error, 1)}
	go func() { s.done <- d.Serve(l) }()
	return s, nil
}

// Close stops the device, releases every client's resources and removes
// the socket directory.
func (s *Server) Close() error {
	err := s.Device.Close()
	if serr := <-s.done; serr != nil && !errors.Is(serr, device.ErrClosed) && err == nil {
		err = serr
	}
	s.Space.Close()
	if rerr := os.RemoveAll(s.dir); rerr != nil && err == nil {
		err = rerr
	}
	return err
}

// NopDataPlane is a device.DataPlane that moves nothing: fakes of the data
// plane embed it and override what they observe.
type NopDataPlane struct{}

func (NopDataPlane) CreateQP(*device.QP) error { return nil }
func (NopDataPlane) CheckModifyQP(*device.QP, device.QPState, device.QPState, device.AttrMask, *abi.QPAttr) error {
	return nil
}
func (NopDataPlane) ModifyQP(*device.QP, device.QPState, device.AttrMask) {}
func (NopDataPlane) DestroyQP(*device.QP) <-chan device.QPCounters        { return nil }
func (NopDataPlane) Counters(*device.QP) device.QPCounters                { return device.QPCounters{} }
func (NopDataPlane) AddAH(*device.AH) error                               { return nil }
func (NopDataPlane) RemoveAH(*device.AH)                                  {}
func (NopDataPlane) ReleaseCQ(*device.CQ)                                 {}
func (NopDataPlane) ResizeCQ(*device.CQ, []byte, uint32) (uint32, error)  { return 0, nil }
func (NopDataPlane) ReleaseSRQ(*device.SRQ)                               {}
func (NopDataPlane) WireCounters() device.WireCounters                    { return device.WireCounters{} }
func (NopDataPlane) RejectedWQEs() map[string]uint64                      { return nil }
func (NopDataPlane) Doorbells() admin.DoorbellCounters                    { return admin.DoorbellCounters{} }
func (NopDataPlane) LastLinkError() (string, time.Time)                   { return "", time.Time{} }

var _ device.DataPlane = NopDataPlane{}
