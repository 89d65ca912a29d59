package device

// MemErrOf exposes the dma → engine error mapping to the external tests.
var MemErrOf = memErrOf
