package deviceplugin

import (
	"context"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pb "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// GetDevicePluginOptions: the plugin needs no PreStartContainer call and
// has no preference among devices (any of a node's daemons is as good as
// another).
func (p *Plugin) GetDevicePluginOptions(context.Context, *pb.Empty) (*pb.DevicePluginOptions, error) {
	return &pb.DevicePluginOptions{}, nil
}

// ListAndWatch sends the device list at once and again after every change
// (a device found, a daemon's health changing) until the kubelet closes
// the stream or the plugin stops serving.
func (p *Plugin) ListAndWatch(_ *pb.Empty, s pb.DevicePlugin_ListAndWatchServer) error {
	p.count.streams.Add(1)
	defer p.count.streams.Add(-1)
	for {
		devs, _, changed := p.devs.snapshot()
		resp := &pb.ListAndWatchResponse{}
		for _, d := range devs {
			h := pb.Unhealthy
			if d.Healthy {
				h = pb.Healthy
			}
			for _, id := range p.deviceIDs(d.Name) {
				resp.Devices = append(resp.Devices, &pb.Device{ID: id, Health: h})
			}
		}
		if err := s.Send(resp); err != nil {
			return err
		}
		select {
		case <-s.Context().Done():
			return nil
		case <-changed:
		}
	}
}

// Allocate gives each container the devices the kubelet chose: their
// control sockets, the drop-in libraries, the environment vrnic-run sets
// and the devices' view (allocate.go).
func (p *Plugin) Allocate(_ context.Context, req *pb.AllocateRequest) (*pb.AllocateResponse, error) {
	resp := &pb.AllocateResponse{}
	for _, cr := range req.GetContainerRequests() {
		car, err := p.allocateContainer(cr.GetDevicesIds())
		if err != nil {
			p.count.refused.Add(1)
			p.log.Warn("allocation refused", "devices", cr.GetDevicesIds(), "err", err)
			return nil, status.Error(codes.FailedPrecondition, err.Error())
		}
		p.count.allocated.Add(1)
		p.log.Info("allocated", "devices", cr.GetDevicesIds())
		resp.ContainerResponses = append(resp.ContainerResponses, car)
	}
	return resp, nil
}

// PreStartContainer is not asked for (GetDevicePluginOptions); it does
// nothing.
func (p *Plugin) PreStartContainer(context.Context, *pb.PreStartContainerRequest) (*pb.PreStartContainerResponse, error) {
	return &pb.PreStartContainerResponse{}, nil
}
