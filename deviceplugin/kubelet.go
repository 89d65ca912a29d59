package deviceplugin

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pb "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// Run watches the devices and serves the kubelet until ctx ends: it
// serves the DevicePlugin service on PluginDir/Endpoint, registers with
// the kubelet (PluginDir/kubelet.sock) and, when the kubelet restarts (it
// then removes every socket in its directory and makes a new
// kubelet.sock), serves and registers again. It returns nil when ctx ends,
// or the error that prevents serving at all.
func (p *Plugin) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Add(1)
	go func() {
		defer wg.Done()
		p.discover(ctx, &wg)
	}()
	for ctx.Err() == nil {
		kubelet, err := p.waitKubelet(ctx)
		if err != nil {
			return nil // ctx ended
		}
		if err := p.serveOnce(ctx, kubelet); err != nil {
			p.log.Warn("serving the kubelet", "err", err)
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	}
	return nil
}

// socketID is what identifies one incarnation of a socket file.
type socketID struct{ dev, ino uint64 }

func statSocket(path string) (socketID, bool) {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil || st.Mode&syscall.S_IFMT != syscall.S_IFSOCK {
		return socketID{}, false
	}
	return socketID{uint64(st.Dev), st.Ino}, true
}

// waitKubelet waits for the kubelet's registration socket and returns its
// identity.
func (p *Plugin) waitKubelet(ctx context.Context) (socketID, error) {
	path := filepath.Join(p.cfg.PluginDir, filepath.Base(pb.KubeletSocket))
	logged := false
	for {
		if id, ok := statSocket(path); ok {
			return id, nil
		}
		if !logged {
			p.log.Info("waiting for the kubelet", "socket", path)
			logged = true
		}
		select {
		case <-ctx.Done():
			return socketID{}, ctx.Err()
		case <-time.After(p.cfg.PollInterval):
		}
	}
}

// serveOnce serves on the plugin's socket and registers with the kubelet
// whose socket is kubelet; it returns nil when that kubelet's socket is
// replaced or gone, or the plugin's own socket removed (a kubelet
// restart), or ctx ends.
func (p *Plugin) serveOnce(ctx context.Context, kubelet socketID) error {
	sock := filepath.Join(p.cfg.PluginDir, p.cfg.Endpoint)
	if err := os.Remove(sock); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove old socket: %w", err)
	}
	l, err := net.Listen("unix", sock)
	if err != nil {
		return err
	}
	mine, _ := statSocket(sock)
	srv := grpc.NewServer()
	pb.RegisterDevicePluginServer(srv, p)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()
	defer func() {
		srv.Stop()
		<-served
		// Remove the socket only if it is still ours.
		if id, ok := statSocket(sock); ok && id == mine {
			os.Remove(sock)
		}
	}()
	if err := p.register(ctx); err != nil {
		return err
	}
	p.count.registrations.Add(1)
	p.count.registered.Store(true)
	defer p.count.registered.Store(false)
	p.log.Info("registered with the kubelet", "resource", p.cfg.ResourceName, "endpoint", sock)
	kpath := filepath.Join(p.cfg.PluginDir, filepath.Base(pb.KubeletSocket))
	tick := time.NewTicker(p.cfg.PollInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-served:
			served <- err // for the deferred wait
			return fmt.Errorf("gRPC server stopped: %w", err)
		case <-tick.C:
		}
		if id, ok := statSocket(kpath); !ok || id != kubelet {
			p.log.Info("the kubelet restarted: registering again")
			return nil
		}
		if id, ok := statSocket(sock); !ok || id != mine {
			p.log.Info("the plugin's socket was removed: serving and registering again")
			return nil
		}
	}
}

// register calls the kubelet's Registration service.
func (p *Plugin) register(ctx context.Context) error {
	kpath := filepath.Join(p.cfg.PluginDir, filepath.Base(pb.KubeletSocket))
	conn, err := grpc.NewClient("unix://"+kpath, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err = pb.NewRegistrationClient(conn).Register(ctx, &pb.RegisterRequest{
		Version:      pb.Version,
		Endpoint:     p.cfg.Endpoint,
		ResourceName: p.cfg.ResourceName,
		Options:      &pb.DevicePluginOptions{},
	})
	if err != nil {
		return fmt.Errorf("register with the kubelet at %s: %w", kpath, err)
	}
	return nil
}
