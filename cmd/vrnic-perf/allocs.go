package main

import (
	"runtime"
	"strings"
)

// Counting the allocations of the measured loops. runtime.MemStats counts
// every heap object, including the runtime's own (a new OS thread when a
// system call blocks allocates an M and its g), so the loops are measured
// with the heap profile instead: at rate 1 every allocation is recorded
// with its stack, and loopAllocs counts those made under the measured
// loops (runBW, runLat and everything they call, verbs included).

// enableAllocProfile makes the heap profile record every allocation. Call
// it once, before the endpoint is created.
func enableAllocProfile() { runtime.MemProfileRate = 1 }

// loopFuncs are the measured loops, by function name without the package
// path (a test binary names package main by its import path).
var loopFuncs = []string{"(*endpoint).runBW", "(*endpoint).runLat"}

// loopAllocs returns the number of objects allocated so far under the
// measured loops. The profile is published at the end of a GC cycle, so
// it runs two.
func loopAllocs() uint64 {
	runtime.GC()
	runtime.GC()
	n, _ := runtime.MemProfile(nil, true)
	recs := make([]runtime.MemProfileRecord, n+64)
	n, ok := runtime.MemProfile(recs, true)
	if !ok {
		return 0
	}
	var sum uint64
	for i := range recs[:n] {
		frames := runtime.CallersFrames(recs[i].Stack())
		for {
			f, more := frames.Next()
			if underLoop(f.Function) {
				sum += uint64(recs[i].AllocObjects)
				break
			}
			if !more {
				break
			}
		}
	}
	return sum
}

func underLoop(fn string) bool {
	for _, l := range loopFuncs {
		if strings.HasSuffix(fn, "."+l) || strings.Contains(fn, "."+l+".") {
			return true
		}
	}
	return false
}
