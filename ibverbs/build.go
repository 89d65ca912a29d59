// Package ibverbs holds vrnic's libibverbs.so.1, a C library that stands
// in for the system's libibverbs so that unmodified verbs programs run on
// vrnicd, and the Go code that builds it.
//
// The C sources (this directory's *.c and *.h, embedded in Go binaries
// that import this package) implement the public libibverbs API on the
// client ABI of abi/vrnic_abi.h; vrnic_abi.h here is a copy of that file
// (go generate refreshes it; a test checks it is identical). Build
// compiles them with the system C compiler against the installed
// <infiniband/verbs.h> and links them with a version script generated from
// the installed libibverbs.so.1, so the result exports every symbol with
// the same version node and default/compat binding: names it does not
// implement are stubs that fail with EOPNOTSUPP. Libraries are cached in a
// directory keyed by a hash of the sources, the compiler flags and the
// system library's symbol set.
//
// See README.md in this directory for what works and what cannot.
package ibverbs

//go:generate cp ../abi/vrnic_abi.h src/vrnic_abi.h

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strings"
)

//go:embed src/*.c src/*.h
var sources embed.FS

// LibName is the file name (and soname) of the library.
const LibName = "libibverbs.so.1"

// CMLibName is the file name (and soname) of the librdmacm stand-in,
// built beside LibName from the cma*.c sources (and ctl.c) when the
// system has a librdmacm.so.1 whose interface it copies.
const CMLibName = "librdmacm.so.1"

// NetDevLibName is the file name of the interface shim vrnic-run preloads
// (netdev*.c sources): it shows interfaces holding the addresses of
// devices that no real interface shows (kernel-notes/vrnic-run-view.md).
const NetDevLibName = "libvrnic-netdev.so"

// isNetDevSource reports whether the source file belongs to the shim.
func isNetDevSource(n string) bool { return strings.HasPrefix(n, "netdev") }

// isCMSource reports whether the source file belongs to librdmacm only.
func isCMSource(n string) bool { return strings.HasPrefix(n, "cma") }

// cmShared are the sources compiled into both libraries.
var cmShared = []string{"ctl.c"}

// CFlags are the flags every source is compiled with.
var CFlags = []string{"-std=gnu11", "-Wall", "-Wextra", "-Werror", "-fPIC", "-O2", "-fvisibility=hidden", "-pthread"}

// Options control Build.
type Options struct {
	// CacheDir holds the built libraries; default CacheDir().
	CacheDir string
	// CC is the C compiler; default $CC or "cc".
	CC string
	// ExtraCFlags are added to CFlags (e.g. -fsanitize=address) and
	// to the link; they are part of the cache key.
	ExtraCFlags []string
	// SystemLib is the libibverbs.so.1 whose interface is copied;
	// default SystemLibrary().
	SystemLib string
	// SystemCMLib is the librdmacm.so.1 whose interface is copied;
	// default the installed one (none: CMLibName is not built).
	SystemCMLib string
	// Log, if set, gets the compiler's output and what is done.
	Log io.Writer
}

// CacheDir returns $XDG_CACHE_HOME/vrnic, or ~/.cache/vrnic, or a
// directory under the system temporary directory.
func CacheDir() string {
	if d := os.Getenv("XDG_CACHE_HOME"); d != "" {
		return filepath.Join(d, "vrnic")
	}
	if h, err := os.UserHomeDir(); err == nil && h != "" {
		return filepath.Join(h, ".cache", "vrnic")
	}
	return filepath.Join(os.TempDir(), fmt.Sprintf("vrnic-cache-%d", os.Getuid()))
}

// ErrNoSystemLibrary: no libibverbs.so.1 is installed (package
// libibverbs1 on Debian) to copy the interface from.
var ErrNoSystemLibrary = errors.New("no system libibverbs.so.1 found (install libibverbs1 / libibverbs-dev)")

// SystemLibrary returns the path of the installed libibverbs.so.1, as
// ldconfig knows it, else from the usual library directories.
func SystemLibrary() (string, error) {
	if p := findLibrary(LibName); p != "" {
		return p, nil
	}
	return "", ErrNoSystemLibrary
}

// SystemCMLibrary returns the path of the installed librdmacm.so.1, or
// "" if there is none.
func SystemCMLibrary() string { return findLibrary(CMLibName) }

func findLibrary(name string) string {
	if out, err := exec.Command("ldconfig", "-p").Output(); err == nil {
		sc := bufio.NewScanner(bytes.NewReader(out))
		for sc.Scan() {
			line := strings.TrimSpace(sc.Text())
			if !strings.HasPrefix(line, name+" ") {
				continue
			}
			if i := strings.Index(line, "=> "); i >= 0 {
				p := strings.TrimSpace(line[i+3:])
				if _, err := os.Stat(p); err == nil {
					return p
				}
			}
		}
	}
	for _, d := range []string{"/usr/lib/x86_64-linux-gnu", "/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu",
		"/usr/lib64", "/lib64", "/usr/lib", "/lib"} {
		p := filepath.Join(d, name)
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	return ""
}

// Sources returns the embedded C sources by file name.
func Sources() (map[string][]byte, error) {
	out := map[string][]byte{}
	err := fs.WalkDir(sources, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := sources.ReadFile(p)
		out[path.Base(p)] = b
		return err
	})
	return out, err
}

// Build builds the library if the cache does not hold it yet and returns
// the directory that holds LibName.
func Build(o Options) (string, error) {
	if o.CacheDir == "" {
		o.CacheDir = CacheDir()
	}
	if o.CC == "" {
		o.CC = os.Getenv("CC")
		if o.CC == "" {
			o.CC = "cc"
		}
	}
	if o.Log == nil {
		o.Log = io.Discard
	}
	if o.SystemLib == "" {
		p, err := SystemLibrary()
		if err != nil {
			return "", err
		}
		o.SystemLib = p
	}
	set, err := ReadSymbols(o.SystemLib)
	if err != nil {
		return "", err
	}
	if o.SystemCMLib == "" {
		o.SystemCMLib = SystemCMLibrary()
	}
	var cmSet *SymbolSet
	if o.SystemCMLib != "" {
		if cmSet, err = ReadSymbols(o.SystemCMLib); err != nil {
			return "", err
		}
		if readHeader(cmHeaders[:1]) == "" {
			fmt.Fprintf(o.Log, "no <rdma/rdma_cma.h> (librdmacm-dev): %s is not built\n", CMLibName)
			cmSet = nil
		}
	}
	src, err := Sources()
	if err != nil {
		return "", err
	}
	names := make([]string, 0, len(src))
	for n := range src {
		names = append(names, n)
	}
	sort.Strings(names)
	h := sha256.New()
	for _, n := range names {
		fmt.Fprintf(h, "%s %d\n", n, len(src[n]))
		h.Write(src[n])
	}
	fmt.Fprintf(h, "cc %s\nflags %q %q\n", o.CC, CFlags, o.ExtraCFlags)
	h.Write([]byte(set.Key()))
	if cmSet != nil {
		h.Write([]byte(cmSet.Key()))
	}
	key := hex.EncodeToString(h.Sum(nil))[:16]
	dir := filepath.Join(o.CacheDir, "ibverbs-"+key)
	if _, err := os.Stat(filepath.Join(dir, LibName)); err == nil {
		return dir, nil
	}
	if err := os.MkdirAll(o.CacheDir, 0o755); err != nil {
		return "", err
	}
	tmp, err := os.MkdirTemp(o.CacheDir, ".build-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	fmt.Fprintf(o.Log, "building %s for %s in %s\n", LibName, o.SystemLib, dir)
	for _, n := range names {
		if err := os.WriteFile(filepath.Join(tmp, n), src[n], 0o644); err != nil {
			return "", err
		}
	}
	flags := append(append([]string{}, CFlags...), o.ExtraCFlags...)
	cc := func(args ...string) error {
		cmd := exec.Command(o.CC, args...)
		cmd.Dir = tmp
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		o.Log.Write(out.Bytes())
		if err != nil {
			return fmt.Errorf("%s %s: %w\n%s", o.CC, strings.Join(args, " "), err, out.String())
		}
		return nil
	}
	implemented, cmImplemented := map[string]bool{}, map[string]bool{}
	var objs, cmObjs, ndObjs []string
	for _, n := range names {
		if !strings.HasSuffix(n, ".c") || (cmSet == nil && isCMSource(n)) {
			continue
		}
		if isNetDevSource(n) {
			obj := strings.TrimSuffix(n, ".c") + ".o"
			if err := cc(append(append([]string{}, flags...), "-c", n, "-o", obj)...); err != nil {
				return "", err
			}
			ndObjs = append(ndObjs, obj)
			continue
		}
		obj := strings.TrimSuffix(n, ".c") + ".o"
		if err := cc(append(append([]string{}, flags...), "-c", n, "-o", obj)...); err != nil {
			return "", err
		}
		defs, err := DefinedSymbols(filepath.Join(tmp, obj))
		if err != nil {
			return "", err
		}
		dst, impl := &objs, implemented
		if isCMSource(n) {
			dst, impl = &cmObjs, cmImplemented
		} else if slices.Contains(cmShared, n) {
			cmObjs = append(cmObjs, obj)
		}
		for s := range defs {
			impl[s] = true
		}
		*dst = append(*dst, obj)
	}
	stubs, script := Generate(set, implemented, readHeader(verbsHeaders))
	if err := os.WriteFile(filepath.Join(tmp, "stubs_gen.c"), stubs, 0o644); err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(tmp, "libibverbs.map"), script, 0o644); err != nil {
		return "", err
	}
	// Stubs take no arguments whatever the real prototype: no -Werror
	// prototype checks apply, as the header is not included.
	if err := cc(append(append([]string{}, flags...), "-c", "stubs_gen.c", "-o", "stubs_gen.o")...); err != nil {
		return "", err
	}
	objs = append(objs, "stubs_gen.o")
	link := append(append([]string{}, o.ExtraCFlags...), "-shared", "-pthread", "-Wl,-soname,"+LibName,
		"-Wl,--version-script=libibverbs.map", "-Wl,-z,now", "-o", LibName)
	if err := cc(append(link, objs...)...); err != nil {
		return "", err
	}
	outputs := []string{LibName, "libibverbs.map", "stubs_gen.c"}
	if len(ndObjs) > 0 {
		link := append(append([]string{}, o.ExtraCFlags...), "-shared", "-pthread", "-Wl,-z,now", "-o", NetDevLibName)
		if err := cc(append(append(link, ndObjs...), "-ldl")...); err != nil {
			return "", err
		}
		outputs = append(outputs, NetDevLibName)
	}
	if cmSet != nil {
		// librdmacm: its own sources, linked against the libibverbs just
		// built (DT_NEEDED libibverbs.so.1, versioned references).
		stubs, script := GenerateWith(cmSet, cmImplemented, readHeader(cmHeaders), cmStubs)
		if err := os.WriteFile(filepath.Join(tmp, "rdmacm_stubs_gen.c"), stubs, 0o644); err != nil {
			return "", err
		}
		if err := os.WriteFile(filepath.Join(tmp, "librdmacm.map"), script, 0o644); err != nil {
			return "", err
		}
		if err := cc(append(append([]string{}, flags...), "-c", "rdmacm_stubs_gen.c", "-o", "rdmacm_stubs_gen.o")...); err != nil {
			return "", err
		}
		cmObjs = append(cmObjs, "rdmacm_stubs_gen.o", "./"+LibName)
		link := append(append([]string{}, o.ExtraCFlags...), "-shared", "-pthread", "-Wl,-soname,"+CMLibName,
			"-Wl,--version-script=librdmacm.map", "-Wl,-z,now", "-o", CMLibName)
		if err := cc(append(link, cmObjs...)...); err != nil {
			return "", err
		}
		outputs = append(outputs, CMLibName, "librdmacm.map", "rdmacm_stubs_gen.c")
	} else if o.SystemCMLib == "" {
		fmt.Fprintf(o.Log, "no system %s: %s is not built\n", CMLibName, CMLibName)
	}
	out := filepath.Join(tmp, "out")
	if err := os.Mkdir(out, 0o755); err != nil {
		return "", err
	}
	for _, f := range outputs {
		if err := os.Rename(filepath.Join(tmp, f), filepath.Join(out, f)); err != nil {
			return "", err
		}
	}
	if err := os.Rename(out, dir); err != nil {
		// Another build finished first: use it.
		if _, serr := os.Stat(filepath.Join(dir, LibName)); serr == nil {
			return dir, nil
		}
		return "", err
	}
	return dir, nil
}
