package verbs

import (
	"encoding/binary"
	"fmt"

	"github.com/vrnic/vrnic/abi"
)

// pageList is the page list of a registration (REG_MR, REREG_MR): inline
// holds it for up to abi.InlinePages pages, else pbl, a temporary buffer
// in host memory, does.
type pageList struct {
	length uint64
	npages uint32
	inline []byte
	pbl    *Buffer
}

// pageList builds the page list of buf registered at iova (see RegMRAt).
func (c *Context) pageList(buf *Buffer, iova uint64) (pageList, error) {
	length := uint64(len(buf.Bytes))
	if length == 0 {
		return pageList{}, fmt.Errorf("verbs: RegMR of an empty buffer")
	}
	if iova%pageSize != buf.PA%pageSize {
		return pageList{}, fmt.Errorf("verbs: iova %#x and PA %#x differ in page offset", iova, buf.PA)
	}
	firstPA := buf.PA &^ (pageSize - 1)
	npages := ((iova+length-1)>>pageShift - iova>>pageShift) + 1
	pl := pageList{length: length, npages: uint32(npages)}
	if npages <= abi.InlinePages {
		pl.inline = make([]byte, 8*npages)
	} else {
		var err error
		if pl.pbl, err = c.Alloc(int(8*npages), 64); err != nil {
			return pageList{}, err
		}
	}
	list := pl.inline
	if pl.pbl != nil {
		list = pl.pbl.Bytes
	}
	for i := range npages {
		binary.LittleEndian.PutUint64(list[8*i:], firstPA+i*pageSize)
	}
	return pl, nil
}

// pblPA is the pbl_pa of the command: 0 for an inline list.
func (pl *pageList) pblPA() uint64 {
	if pl.pbl == nil {
		return 0
	}
	return pl.pbl.PA
}

// free frees the temporary buffer, once the daemon has copied the list.
func (pl *pageList) free() { freeBuffers(pl.pbl) }
