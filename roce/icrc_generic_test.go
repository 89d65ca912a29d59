//go:build !amd64

package roce

// archICRCVariants: no architecture kernels here.
func archICRCVariants() []icrcVariant { return nil }

// archCopyVariants: no architecture kernels here.
func archCopyVariants() []copyVariant { return nil }
