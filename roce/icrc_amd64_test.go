//go:build amd64

package roce

// archICRCVariants forces each icrcFold kernel this CPU runs.
func archICRCVariants() []icrcVariant {
	var vs []icrcVariant
	if useFold {
		vs = append(vs, icrcVariant{"narrow", func(n, m int) bool {
			return n >= icrcFoldMin2 || n >= icrcFoldMin && m <= icrcFoldMin
		}, func(c uint32, p []byte, mk *icrcMask, _ int) uint32 {
			return crcFolded(c, p, mk, false)
		}})
	}
	if useFoldWide {
		vs = append(vs, icrcVariant{"wide", func(n, _ int) bool { return n >= icrcFoldWideMin }, func(c uint32, p []byte, mk *icrcMask, _ int) uint32 {
			return crcFolded(c, p, mk, true)
		}})
	}
	return vs
}
