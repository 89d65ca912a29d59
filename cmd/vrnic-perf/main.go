// Command vrnic-perf measures a vrnic device the way linux-rdma perftest
// (ib_write_bw, ib_read_lat, ...) measures an RNIC: bandwidth, message
// rate and latency of RDMA WRITE, RDMA READ, SEND/RECV and atomics over RC
// (and UC or UD) QPs between two processes on two devices.
//
//	vrnic-perf server -dev SOCKET [-listen ADDR] [-selective-repeat] [-ece LIST]
//	vrnic-perf client -dev SOCKET -server ADDR [test options]
//	vrnic-perf run [-link udp|mem | -dev-a SOCKET -dev-b SOCKET] [test options]
//
// ADDR is host:port (TCP, default :18515 as perftest) or unix:/path. The
// client connects to the server's control address and both exchange QPN,
// PSN, GID, rkey and buffer address (proto.go); the server serves one
// client and exits. run starts vrnicd daemons (or uses the given sockets):
// by default two over the UDP link on 127.0.0.1 and 127.0.0.2 (other free
// 127/8 addresses when port 4791 of those is taken), with -link mem one
// daemon whose in-memory link connects both roles; then both roles as
// child processes of this executable. It prints the client's result and
// stops every process it started by its PID.
//
// Tests (-test): write_bw, read_bw, send_bw, atomic_bw (-atomic fetch_add
// or cmp_swap), write_lat, send_lat, read_lat. Bandwidth tests keep -depth
// work requests outstanding per QP on -qps QPs and request a completion
// every -cq-mod (-total-depth bounds the WRs outstanding over all QPs,
// posted to the QPs in turn); -areas N gives each QP's buffer N message
// areas that successive write_bw or read_bw WRs use in turn, so that one
// QP touches as much memory as N QPs (a many-QP run's footprint with one
// QP); latency tests run one operation at a time. write_lat and
// send_lat are ping-pongs (the server answers each message with the same
// operation) and report half the round trip, read_lat the whole READ, as
// perftest does.
//
// Transports (-transport): rc (default); uc, for write_bw, send_bw,
// write_lat and send_lat; ud, for send_bw and send_lat with messages of at
// most -mtu bytes (one packet; each side creates an AH to the other, and
// the receive buffers hold the 40-byte GRH in front of the data). UC and
// UD do not retransmit: the send_bw server stops waiting 200 ms after the
// last message that arrived and reports how many were lost (lost).
//
// Correctness: after each size the data is verified (checksums of the
// memory each side wrote into, atomic target words equal to the number of
// operations, every fetch-add and cmp-swap return value seen; -verify=false
// skips the checksums); a failed completion stops the run with its status
// and a non-zero exit.
//
// ECE: -selective-repeat (and -ece sr,rto, all or none) asks for vrnic's
// ECE transport options on RC QPs, on the client and on the server: the
// client offers those its device supports in its hello, the server takes
// those it asked for too and its device supports, sets them at RTR and
// tells the client, which sets them too: an option runs only when both
// sides asked for it, as the CM's REQ and REP agree on them for rdma_cm
// programs. run passes them to both roles. The report names the options
// in force (ece).
//
// Figures: Gb/s and MB/s (10^6 bytes per second) of payload, Mops/s,
// latency min/p50/p99/p99.9/max from a histogram with 1.6 % bucket
// resolution, retransmissions and RNR NAKs from the QPs' counters
// (QUERY_QP, both sides), and the heap allocations made during the
// measured loop (loop_allocs, zero: buffers and work requests are
// prepared before it). -json prints the same as JSON.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

// mainEnv marks a child process started by run: the test binary re-runs
// itself this way too.
const mainEnv = "VRNIC_PERF_MAIN"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	os.Exit(realMain(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

const usage = `usage:
  vrnic-perf server -dev SOCKET [-listen ADDR] [-selective-repeat] [-ece LIST]
  vrnic-perf client -dev SOCKET -server ADDR [test options]
  vrnic-perf run [-link udp|mem] [-dev-a SOCKET -dev-b SOCKET] [test options]
  vrnic-perf scale -dev-a SOCKET -dev-b SOCKET [-qps N] [-depth D] [-hold]
run "vrnic-perf client -h" for the test options`

// realMain runs a subcommand and returns the exit status.
func realMain(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprintln(stderr, usage)
		return 2
	}
	var err error
	switch args[0] {
	case "server":
		err = serverMain(args[1:], stdout, stderr)
	case "client":
		err = clientMain(args[1:], stdout, stderr)
	case "run":
		err = runMain(ctx, args[1:], stdout, stderr)
	case "scale":
		err = scaleMain(args[1:], os.Stdin, stdout, stderr)
	default:
		fmt.Fprintln(stderr, usage)
		return 2
	}
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 2
	case errors.Is(err, errUsage):
		fmt.Fprintf(stderr, "vrnic-perf %s: %v\n", args[0], err)
		return 2
	default:
		fmt.Fprintf(stderr, "vrnic-perf %s: FAIL: %v\n", args[0], err)
		return 1
	}
}

var errUsage = errors.New("usage")

func serverMain(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("vrnic-perf server", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dev := fs.String("dev", "", "the device's control socket")
	listen := fs.String("listen", ":18515", "control address: host:port (TCP) or unix:/path")
	var ece eceFlags
	ece.add(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *dev == "" || fs.NArg() > 0 {
		return fmt.Errorf("%w: -dev is required, no arguments", errUsage)
	}
	opts, _, err := ece.options()
	if err != nil {
		return fmt.Errorf("%w: %w", errUsage, err)
	}
	return serve(*dev, *listen, opts, stdout)
}

func clientMain(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("vrnic-perf client", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dev := fs.String("dev", "", "the device's control socket")
	server := fs.String("server", "", "the server's control address: host:port (TCP) or unix:/path")
	var o options
	o.addFlags(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *dev == "" || *server == "" || fs.NArg() > 0 {
		return fmt.Errorf("%w: -dev and -server are required, no arguments", errUsage)
	}
	if err := o.finish(); err != nil {
		return fmt.Errorf("%w: %w", errUsage, err)
	}
	enableAllocProfile()
	rs, err := runClientRole(*dev, *server, &o)
	if len(rs) > 0 {
		if o.JSON {
			writeJSON(stdout, rs)
		} else {
			writeTable(stdout, &o, rs)
		}
	}
	return err
}
