package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"time"

	"github.com/vrnic/vrnic/admin"
)

// The service manager's readiness protocol (sd_notify(3)): a unit of
// Type=notify names a datagram socket in $NOTIFY_SOCKET (a path, or an
// abstract name after '@', which the net package maps), and the daemon
// sends newline-separated assignments to it. vrnicd sends READY=1 once its
// control socket answers a query, STOPPING=1 when it begins to stop.
// Without NOTIFY_SOCKET nothing is sent.

// sdNotify sends state to $NOTIFY_SOCKET. It reports whether a socket
// was named; an error is a named socket that did not take the message.
func sdNotify(state string) (bool, error) {
	path := os.Getenv("NOTIFY_SOCKET")
	if path == "" {
		return false, nil
	}
	c, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		return true, fmt.Errorf("notify socket %s: %w", path, err)
	}
	defer c.Close()
	if _, err := c.Write([]byte(state)); err != nil {
		return true, fmt.Errorf("notify socket %s: %w", path, err)
	}
	return true, nil
}

// readyCheckTimeout bounds one query of the daemon's own control socket.
const readyCheckTimeout = 5 * time.Second

// notifyReady queries the control socket sock as a client would (a
// daemon whose socket exists but does not serve is not ready) and, once
// it answers, sends READY=1 with a status line. It gives up when ctx
// ends; a daemon that never answers never reports ready, and the service
// manager's start timeout handles it.
func notifyReady(ctx context.Context, sock, name string, log *slog.Logger) {
	if os.Getenv("NOTIFY_SOCKET") == "" {
		return
	}
	for ctx.Err() == nil {
		err := queryOnce(sock)
		if err == nil {
			state := fmt.Sprintf("READY=1\nSTATUS=serving device %s on %s\nMAINPID=%d", name, sock, os.Getpid())
			if _, err := sdNotify(state); err != nil {
				log.Warn("readiness notification", "err", err)
			}
			return
		}
		log.Debug("readiness check", "err", err)
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// queryOnce asks the daemon at sock for its information, bounded by
// readyCheckTimeout.
func queryOnce(sock string) error {
	c, err := admin.Dial(sock)
	if err != nil {
		return err
	}
	defer c.Close()
	done := make(chan error, 1)
	go func() {
		_, err := c.Info()
		done <- err
	}()
	select {
	case err := <-done:
		return err
	case <-time.After(readyCheckTimeout):
		c.Close() // unblocks Info
		<-done
		return fmt.Errorf("control socket %s: no answer in %v", sock, readyCheckTimeout)
	}
}
