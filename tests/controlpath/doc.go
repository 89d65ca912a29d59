// Package controlpath holds multi-process tests of the vrnic control path:
// real vrnicd processes, clients in separate processes (the test binary
// re-executed with VRNIC_TEST_CLIENT set), vrnicctl as a real command.
package controlpath
