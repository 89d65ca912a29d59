package verbs

import (
	"crypto/rand"
	"errors"
	"fmt"
	"math"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"unsafe"

	"github.com/vrnic/vrnic/abi"
	"golang.org/x/sys/unix"
)

// On-demand paging (ABI 1.4), as the project's C library gives it to
// libibverbs programs (ibverbs/src/odp.c; kernel-notes/odp.md): an ODP MR
// covers this process's virtual memory, which the daemon reaches when
// traffic touches it (process_vm_readv/writev), without pinning or
// remapping anything at registration. The context attaches its process
// once (ODP_ATTACH): a random nonce in this process's memory, which the
// daemon reads there, proves the connection's process is this one.

// odpState is a context's attachment: done once, its refusal kept.
type odpState struct {
	mu   sync.Mutex
	done bool
	err  error
	caps abi.RespODPAttach
}

// ODPCaps attaches the process for on-demand paging if it was not yet
// and returns the device's ODP capabilities (ibv_odp_caps: GeneralCaps
// abi.ODPSupport, abi.ODPSupportImplicit; per transport abi.ODPSupport*).
// A refusal is kept (a daemon that cannot read this process's memory:
// EPERM), as libibverbs keeps it.
func (c *Context) ODPCaps() (abi.RespODPAttach, error) {
	s := &c.odp
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.done {
		s.caps, s.err = c.odpAttach()
		s.done = !errors.Is(s.err, ErrClosed) // a closed connection is no refusal
	}
	return s.caps, s.err
}

func (c *Context) odpAttach() (abi.RespODPAttach, error) {
	var r abi.RespODPAttach
	nonce := new([abi.ODPNonceLen]byte)
	if _, err := rand.Read(nonce[:]); err != nil {
		return r, err
	}
	req := abi.CmdODPAttachReq{NonceAddr: uint64(uintptr(unsafe.Pointer(nonce))), Nonce: *nonce}
	c.allowDaemonTrace()
	_, _, err := c.k.call(abi.CmdODPAttach, &req, nil, nil, &r)
	*nonce = [abi.ODPNonceLen]byte{}
	runtime.KeepAlive(nonce) // the daemon read it during the call
	return r, err
}

// allowDaemonTrace names the daemon (the control socket's peer) as this
// process's ptracer under Yama's ptrace_scope 1, where only a named
// process may read another's memory; other scopes need nothing (0) or
// refuse anyway (2, 3: the attach then fails with EPERM).
func (c *Context) allowDaemonTrace() {
	b, err := os.ReadFile("/proc/sys/kernel/yama/ptrace_scope")
	if err != nil {
		return
	}
	if scope, err := strconv.Atoi(strings.TrimSpace(string(b))); err != nil || scope != 1 {
		return
	}
	raw, err := c.k.c.SyscallConn()
	if err != nil {
		return
	}
	_ = raw.Control(func(fd uintptr) {
		if cr, err := unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED); err == nil && cr.Pid > 0 {
			_ = unix.Prctl(unix.PR_SET_PTRACER, uintptr(cr.Pid), 0, 0, 0)
		}
	})
}

// RegMRODP registers length bytes of this process's memory at addr as an
// on-demand-paging MR (ibv_reg_mr with IBV_ACCESS_ON_DEMAND), its IOVA
// addr. Nothing is pinned: pages are reached when traffic touches them,
// and a page not mapped then completes the request with an access error
// (REM_ACCESS_ERR at a responder, LOC_PROT_ERR locally). A device without
// ODP: EOPNOTSUPP. The memory must stay valid while the MR can be used;
// addr may name memory this package did not allocate (a mapping, a slice
// kept alive).
func (pd *PD) RegMRODP(addr uintptr, length uint64, access uint32) (*MR, error) {
	if length == 0 || length > abi.MaxMRSize {
		return nil, fmt.Errorf("verbs: RegMRODP length %d: 1..%d: %w", length, uint64(abi.MaxMRSize), unix.EINVAL)
	}
	return pd.regODP(abi.CmdRegMRODPReq{Addr: uint64(addr), IOVA: uint64(addr), Length: length}, access, false)
}

// RegMRImplicitODP registers the process's whole address space as an
// implicit on-demand-paging MR (ibv_reg_mr(pd, NULL, SIZE_MAX,
// IBV_ACCESS_ON_DEMAND)): IOVA 0, the address is the process virtual
// address. A device without implicit ODP: EINVAL (as mlx5 answers).
func (pd *PD) RegMRImplicitODP(access uint32) (*MR, error) {
	return pd.regODP(abi.CmdRegMRODPReq{Length: math.MaxUint64, Flags: abi.ODPFlagImplicit}, access, true)
}

func (pd *PD) regODP(req abi.CmdRegMRODPReq, access uint32, implicit bool) (*MR, error) {
	c := pd.ctx
	caps, err := c.ODPCaps()
	if err != nil || caps.GeneralCaps&abi.ODPSupport == 0 {
		return nil, fmt.Errorf("verbs: on-demand paging unavailable (%v): %w", err, unix.EOPNOTSUPP)
	}
	if implicit && caps.GeneralCaps&abi.ODPSupportImplicit == 0 {
		return nil, fmt.Errorf("verbs: implicit on-demand paging unsupported: %w", unix.EINVAL)
	}
	req.PDHandle, req.Access = pd.Handle, access&0xf
	var r abi.RespRegMR
	if _, _, err := c.k.call(abi.CmdRegMRODP, &req, nil, nil, &r); err != nil {
		return nil, err
	}
	return &MR{ctx: c, Handle: r.MRHandle, LKey: r.LKey, RKey: r.RKey, Addr: req.IOVA, Length: req.Length}, nil
}

// AdviseMR gives the device advice on ODP MRs of pd (ibv_advise_mr):
// abi.AdvicePrefetch, AdvicePrefetchW (for writing) or AdvicePrefetchNoPF,
// over the ranges in sges (lkeys of this PD's ODP MRs); flags
// abi.AdviseMRFlagFlush waits for the prefetch. Errors as the kernel's:
// EOPNOTSUPP without ODP, EINVAL for no or too many SGEs, bad advice or
// flags, a range outside its MR or an MR that is not ODP or not this PD's,
// EFAULT for memory not mapped.
func (pd *PD) AdviseMR(advice, flags uint32, sges []abi.SGE) error {
	if _, err := pd.ctx.ODPCaps(); err != nil {
		return fmt.Errorf("verbs: AdviseMR: on-demand paging unavailable (%v): %w", err, unix.EOPNOTSUPP)
	}
	if len(sges) == 0 || len(sges) > abi.MaxSGE {
		return fmt.Errorf("verbs: AdviseMR: 1..%d SGEs: %w", abi.MaxSGE, unix.EINVAL)
	}
	extra := make([]byte, len(sges)*abi.SizeofSGE)
	for i := range sges {
		sges[i].Put(extra[i*abi.SizeofSGE:])
	}
	req := abi.CmdAdviseMRReq{PDHandle: pd.Handle, Advice: advice, Flags: flags, NumSGE: uint32(len(sges))}
	_, _, err := pd.ctx.k.call(abi.CmdAdviseMR, &req, extra, nil, nil)
	return err
}
