package ebpf

import "github.com/cilium/ebpf/asm"

// asmReturn is a program body returning v.
func asmReturn(v int32) asm.Instructions {
	return asm.Instructions{
		asm.Mov.Imm(asm.R0, v),
		asm.Return(),
	}
}
