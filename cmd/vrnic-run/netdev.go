package main

// Network interfaces for the devices (kernel-notes/vrnic-run-view.md,
// "Network interfaces"): internal/devview decides which devices get a
// synthetic interface, vrnic-DEVICE; here the interface shim
// (libvrnic-netdev.so) is preloaded into the program to show them.

import (
	"debug/elf"
	"path/filepath"
	"strings"

	"github.com/vrnic/vrnic/ibverbs"
	"github.com/vrnic/vrnic/internal/devview"
)

// withNetDevs adds the shim to LD_PRELOAD (after what is there: a
// sanitizer's runtime must come first) and describes nds to it. prog is
// the program: one linked with AddressSanitizer's runtime gets that
// runtime preloaded first, as ASan requires once anything is preloaded.
func withNetDevs(env []string, libDir, prog string, nds []devview.NetDev) []string {
	if len(nds) == 0 {
		return env
	}
	pre := ""
	for _, e := range env {
		if v, ok := strings.CutPrefix(e, "LD_PRELOAD="); ok {
			pre = v
		}
	}
	if asan := asanRuntime(prog); asan != "" && !strings.Contains(pre, "libasan") {
		if pre == "" {
			pre = asan
		} else {
			pre = asan + ":" + pre
		}
	}
	lib := filepath.Join(libDir, ibverbs.NetDevLibName)
	if pre != "" {
		lib = pre + ":" + lib
	}
	env = setEnv(env, "LD_PRELOAD", lib)
	return setEnv(env, devview.NetDevsEnvVar, devview.NetDevsEnv(nds))
}

// asanRuntime returns the AddressSanitizer runtime prog needs (its
// DT_NEEDED libasan.so.N), or "".
func asanRuntime(prog string) string {
	f, err := elf.Open(prog)
	if err != nil {
		return ""
	}
	defer f.Close()
	libs, err := f.ImportedLibraries()
	if err != nil {
		return ""
	}
	for _, l := range libs {
		if strings.HasPrefix(l, "libasan.so") {
			return l
		}
	}
	return ""
}
