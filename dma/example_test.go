package dma_test

import (
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/vrnic/vrnic/dma"
)

// Example walks the life of client memory: the client creates and seals a
// memfd, the device adds it and registers an MR over two of its pages in
// reverse order, and a worker writes through the rkey.
func Example() {
	space, err := dma.NewSpace(dma.Config{NoMlock: true})
	if err != nil {
		panic(err)
	}
	defer space.Close()

	// Client side: an 8 KiB memfd sealed against shrinking, mapped.
	fd, _ := unix.MemfdCreate("client", unix.MFD_ALLOW_SEALING|unix.MFD_CLOEXEC)
	defer unix.Close(fd)
	_ = unix.Ftruncate(fd, 8192)
	_, _ = unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK)
	client, _ := unix.Mmap(fd, 0, 8192, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	defer unix.Munmap(client)

	// Device side: ADD_HOST_MEM, then REG_MR with the page list.
	const owner, pdHandle = dma.Owner(1), 7
	region, err := space.AddRegion(owner, fd, 8192)
	if err != nil {
		panic(err)
	}
	mr, err := space.RegisterMR(owner, pdHandle, 0x10000, 8192,
		dma.AccessLocalWrite|dma.AccessRemoteWrite, dma.PageShift4K,
		[]uint64{region.PA + 4096, region.PA}) // IOVA page 0 is memfd page 1
	if err != nil {
		panic(err)
	}

	// A worker: an RDMA WRITE of 6 bytes across the IOVA page boundary.
	acc := space.NewAccessor()
	defer acc.Close()
	pd := dma.PD{Owner: owner, Handle: pdHandle}
	if err := acc.WriteRemote(mr.RKey, pd, 0x10000+4093, []byte("vrnic!")); err != nil {
		panic(err)
	}
	fmt.Printf("%s|%s\n", client[4096+4093:8192], client[0:3])
	err = acc.WriteRemote(mr.RKey, dma.PD{Owner: 2, Handle: pdHandle}, 0x10000, []byte("x"))
	fmt.Println(err)
	// Output:
	// vrn|ic!
	// dma: key of another protection domain
}
