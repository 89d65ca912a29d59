// Package admin is the operator's side of a vrnic device: the client of
// the operator commands of the control socket (Client, used by vrnicctl,
// the launchers of vrnic-demo and vrnic-perf, and tests), the JSON types
// those commands carry (Info and the per-object listings, the resource
// counts and limits, the per-QP data-path counters), the link statistics
// a daemon serves beside its control socket (LinkStats), and where the
// sockets live (RuntimeDir, SocketPath, CreateRuntimeDir, Listen).
//
// It imports only package abi (and the standard library), so a program
// that drives a daemon as an operator links none of the data plane: no
// engine, no dma, no doorbells, no ring views.
//
// # Operator commands
//
// They use the opcode range VRNIC_CMD_ADMIN_BASE (0x100..0x1ff) and, unlike
// the client commands, carry JSON after the message header instead of a C
// struct. The daemon's side is in package device (operator.go).
package admin
