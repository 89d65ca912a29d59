package main

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/vrnic/vrnic/admin"
)

// showCM prints the communication manager's CM IDs and the QP1 and MAD
// counters (admin.CMCmd), fetching every page of IDs.
func showCM(path string, asJSON bool, w io.Writer) error {
	a, err := admin.Dial(path)
	if err != nil {
		return err
	}
	defer a.Close()
	var info admin.CMInfo
	for start := 0; ; {
		b, err := a.Call(admin.CMCmd, admin.Request{Start: start})
		if err != nil {
			return err
		}
		var page admin.CMInfo
		if err := json.Unmarshal(b, &page); err != nil {
			return err
		}
		ids := append(info.IDs, page.IDs...)
		info, info.IDs = page, ids
		if page.Next == 0 {
			break
		}
		start = page.Next
	}
	info.Next = 0
	if asJSON {
		e := json.NewEncoder(w)
		e.SetIndent("", "  ")
		return e.Encode(info)
	}
	if !info.Enabled {
		fmt.Fprintln(w, "no communication manager (the device has no QP1)")
		return nil
	}
	q := info.QP1
	fmt.Fprintf(w, "QP1: sent %d, send errors %d, send dropped %d, overflow %d, received %d, dropped %d, receive errors %d, no receive slot %d\n",
		q.Sent, q.SendErrors, q.SendDropped, q.Overflow, q.Received, q.Dropped, q.RecvErrors, q.NoRecvSlot)
	fmt.Fprintf(w, "CM MADs: sent %d, retransmissions %d, received %d, duplicates %d, invalid %d, unmatched %d\n",
		info.MADsSent, info.Retransmissions, info.MADsReceived, info.Duplicates, info.Invalid, info.Unmatched)
	fmt.Fprintf(w, "CM IDs: %d, connections: %d, half-open: %d (shed %d, expired %d)\n", info.Total, info.Connections,
		info.HalfOpen, info.Shed, info.Expired)
	for _, r := range []struct {
		dir string
		m   map[string]uint64
	}{{"sent", info.RejectsSent}, {"received", info.RejectsReceived}} {
		if len(r.m) == 0 {
			continue
		}
		words := make([]string, 0, len(r.m))
		for _, k := range slices.Sorted(maps.Keys(r.m)) {
			words = append(words, fmt.Sprintf("%s %d", k, r.m[k]))
		}
		fmt.Fprintf(w, "REJs %s: %s\n", r.dir, strings.Join(words, ", "))
	}
	if len(info.IDs) == 0 {
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CTX\tID\tTYPE\tROLE\tSERVICE\tCONN\tSTATE\tPEER\tLAST EVENT\tECE")
	for _, id := range info.IDs {
		svc := "-"
		if id.ServiceID != 0 {
			svc = fmt.Sprintf("%#x", id.ServiceID)
		}
		if id.Role == "listen" {
			svc += fmt.Sprintf(" (%d/%d)", id.Pending, id.Backlog)
		}
		conn := "-"
		if id.Conn != 0 {
			conn = fmt.Sprintf("%#x", id.Conn)
		}
		fmt.Fprintf(tw, "%d\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", id.Ctx, id.ID, id.QPType, id.Role, svc, conn,
			dash(id.State), dash(id.Peer), dash(id.LastEvent), dash(id.ECE))
	}
	return tw.Flush()
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
