package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"sort"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/vrnic/vrnic/admin"
)

// statsPath is the stats socket beside control socket sock.
func statsPath(sock string) string {
	return strings.TrimSuffix(sock, admin.SocketSuffix) + admin.StatsSuffix
}

// fetchLink reads one JSON document from the stats socket of the daemon
// whose control socket is sock.
func fetchLink(sock string) (json.RawMessage, error) {
	p := statsPath(sock)
	c, err := net.DialTimeout("unix", p, 5*time.Second)
	if err != nil {
		return nil, fmt.Errorf("link counters: %w (only the TAP and UDP links serve them, on %s)", err, p)
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	b, err := io.ReadAll(io.LimitReader(c, 1<<20))
	if err != nil {
		return nil, err
	}
	var probe map[string]json.RawMessage
	if err := json.Unmarshal(b, &probe); err != nil {
		return nil, fmt.Errorf("link counters from %s: %w", p, err)
	}
	if e, ok := probe["error"]; ok {
		return nil, fmt.Errorf("link counters: daemon says %s", e)
	}
	return json.RawMessage(b), nil
}

func showLink(sock string, asJSON bool, w io.Writer) error {
	raw, err := fetchLink(sock)
	if err != nil {
		return err
	}
	if asJSON {
		var v any
		if err := json.Unmarshal(raw, &v); err != nil {
			return err
		}
		return writeJSON(w, v)
	}
	var st admin.LinkStats
	if err := json.Unmarshal(raw, &st); err != nil {
		return err
	}
	if st.Link == "" {
		return errors.New("link counters: empty reply")
	}
	return printLink(w, &st)
}

func printLink(w io.Writer, st *admin.LinkStats) error {
	if st.Link == "udp" {
		return printUDPLink(w, st)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "link\t%s\ninterface\t%s\nmac\t%s\n", st.Link, st.Interface, st.MAC)
	if st.Offload != "" {
		fmt.Fprintf(tw, "offload\t%s\n", st.Offload)
	}
	fmt.Fprintln(tw)
	fmt.Fprintln(tw, "QUEUE\tSTEERED\tRX_FRAMES\tRX_BYTES\tRX_NEIGHBOR\tRX_OTHER\tRX_MISQUEUED\tTX_FRAMES\tTX_BYTES\tTX_ERRORS\tREAD_ERRORS\tTX_GSO\tTX_GSO_FRAMES\tRX_GSO\tRX_GSO_FRAMES\tRX_BAD")
	for _, q := range st.Queues {
		fmt.Fprintf(tw, "%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\n", q.Queue, q.Steered, q.RxFrames, q.RxBytes, q.RxNeighbor,
			q.RxOther, q.RxMisqueued, q.TxFrames, q.TxBytes, q.TxErrors, q.ReadErrors, q.TxGSO, q.TxGSOFrames, q.RxGSO, q.RxGSOFrames, q.RxBad)
	}
	fmt.Fprintf(tw, "\nsteer_non_roce\t%d\nfilter_dropped\t%d\n", st.SteerNonRoCE, st.FilterDropped)
	for _, m := range []struct {
		prefix string
		vals   map[string]uint64
	}{{"filter.", st.Filter}, {"neighbors.", st.Neighbors}} {
		keys := make([]string, 0, len(m.vals))
		for k := range m.vals {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			fmt.Fprintf(tw, "%s%s\t%d\n", m.prefix, k, m.vals[k])
		}
	}
	return tw.Flush()
}

// printUDPLink prints the UDP link's counters: a line per port (socket),
// frames per system call, and what was lost and why.
func printUDPLink(w io.Writer, st *admin.LinkStats) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "link\t%s\nlocal\t%s\n\n", st.Link, st.Local)
	fmt.Fprintln(tw, "PORT\tTX_FRAMES\tTX_BYTES\tTX_DATAGRAMS\tTX_CALLS\tTX_PER_CALL\tRX_FRAMES\tRX_BYTES\tRX_DATAGRAMS\tRX_CALLS\tRX_PER_CALL\tGSO\tGRO\tTX_GSO\tRX_GRO\tGSO_OFF\tBACKPRESSURE\tSEND_ERRORS\tRECV_ERRORS\tRX_TRUNCATED\tRX_FOREIGN\tTX_INVALID\tRX_FORWARDED\tFORWARD_DROPS")
	per := func(n, calls uint64) string {
		if calls == 0 {
			return "-"
		}
		return fmt.Sprintf("%.1f", float64(n)/float64(calls))
	}
	onOff := func(b bool) string {
		if b {
			return "on"
		}
		return "off"
	}
	for _, p := range st.Ports {
		fmt.Fprintf(tw, "%d\t%d\t%d\t%d\t%d\t%s\t%d\t%d\t%d\t%d\t%s\t%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\n", p.Port,
			p.TxFrames, p.TxBytes, p.TxDatagrams, p.TxCalls, per(p.TxFrames, p.TxCalls),
			p.RxFrames, p.RxBytes, p.RxDatagrams, p.RxCalls, per(p.RxFrames, p.RxCalls),
			onOff(p.GSO), onOff(p.GRO), p.TxGSO, p.RxGRO, p.GSOOff, p.Backpressure, p.SendErrors, p.RecvErrors, p.RxTruncated, p.RxForeign, p.TxInvalid, p.RxForwarded, p.RxForwardDrops)
	}
	for _, p := range st.Ports {
		if p.LastSendErrno != 0 {
			fmt.Fprintf(tw, "\nport %d last send error\t%v\n", p.Port, syscall.Errno(p.LastSendErrno))
		}
	}
	return tw.Flush()
}
