package main

import (
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"os"
	"sync"
	"time"
)

// serveStats listens on the unix stream socket path and writes, to every
// connection, one JSON document from read, then closes it. The returned
// function stops the listener, waits for it and removes the socket.
func serveStats(path string, read func() (any, error), log *slog.Logger) (func(), error) {
	if fi, err := os.Lstat(path); err == nil && fi.Mode()&os.ModeSocket != 0 {
		os.Remove(path) // left by a crashed daemon: the control socket's lock is held by us
	}
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, err
	}
	l.SetUnlinkOnClose(true)
	if err := os.Chmod(path, 0o660); err != nil {
		l.Close()
		return nil, err
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := l.AcceptUnix()
			if err != nil {
				if !errors.Is(err, net.ErrClosed) {
					log.Warn("stats socket", "err", err)
				}
				return
			}
			c.SetWriteDeadline(time.Now().Add(5 * time.Second))
			v, err := read()
			if err != nil {
				v = map[string]string{"error": err.Error()}
			}
			json.NewEncoder(c).Encode(v)
			c.Close()
		}
	}()
	log.Info("stats socket", "path", path)
	return func() {
		l.Close()
		wg.Wait()
	}, nil
}
