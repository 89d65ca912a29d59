// Package faultmatrix is an example fault suite to copy: one workload
// (RDMA WRITEs, SENDs and RDMA READs between RC QPs of two vrnicd daemons
// over the UDP link) under a matrix of faults, wire-level and verb-level,
// each cell checked with the checks of package faults/suite: every work
// request completed exactly once with SUCCESS, the data intact (none
// changed without an ICRC error at the receiver), the requester's
// retransmissions go-back-N. The test prints the matrix as a table, one
// row per cell with PASS or FAIL and what the faults did:
//
//	go test -v -run Matrix ./examples/faultmatrix/
//
// Each cell runs on a fresh pair of daemons with the fault seed 1, so a
// failing cell replays. To add a cell, add a row to cells: its rules for
// daemon A (the requester) and daemon B (the responder), as a test suite
// would send them with vrnicctl fault add or admin.FaultCmd.
package faultmatrix
