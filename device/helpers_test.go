package device

import "golang.org/x/sys/unix"

func errnoName(e unix.Errno) string { return unix.ErrnoName(e) }
