// Command vrnicctl is the operator CLI of vrnic: it lists the devices
// (control sockets) in the runtime directory and shows a device's
// contexts, resources, QPs (state, PSNs, counters) and counters over the
// control socket's operator commands. info and counters include the
// device's data-path totals (data_path: packets sent and received,
// retransmissions, ACK timeouts, RNR and sequence NAKs, duplicates, drops,
// completions), the engine's per-QP counters summed over every QP the
// device has had, and its wire counters (frames in and out, and the
// received frames dropped before any QP saw them: malformed, bad ICRC,
// unknown QP, not from the QP's peer).
//
//	vrnicctl [flags] devices
//	vrnicctl [flags] info | counters | contexts | pds | mrs | cqs | qps | srqs | ahs | hostmem
//	vrnicctl [flags] accounts
//	vrnicctl [flags] link
//
// accounts shows, per uid (a client is its uid), the control connections,
// the contexts and the resources of those contexts summed (host memory
// regions and bytes, MRs and their page-table entries, PDs, CQs, QPs,
// SRQs, AHs), and the connections refused at the per-uid limit.
//
// The operator commands behind all of these are served to root, the
// daemon's uid and the members of its -operator-group only; anyone else
// gets "operation not permitted" (devices shows such a device as up,
// without its details).
//
// fault lists, adds, changes and removes the fault rules of a running
// daemon (fault list|add|set|del|clear; "vrnicctl fault" prints the keys
// of a rule): see README.md and package faults.
//
// tcfault attaches the kernel-side fault injector (package ebpf, a tc
// program) to an interface's ingress or egress hook, where it drops,
// corrupts, duplicates or ECN-marks the RoCE v2 frames of any sender
// (Soft-RoCE, a hardware RNIC, a bridge between daemons) by QP, opcode
// and PSN with seeded probabilities; it stays attached, pinned on a bpffs,
// until "tcfault detach" (tcfault attach|add|list|clear|detach;
// "vrnicctl tcfault" prints the keys). It needs no daemon, and root.
//
// cm lists the communication manager's CM IDs (context, role, service
// ID, connection state, peer, last event) and the counters of QP1 and of
// the CM's MADs (sent, retransmitted, received, dropped).
//
// link shows the link counters a daemon serves on its stats socket
// (<name>.stats beside <name>.sock; the TAP link): per queue, the frames
// the eBPF steering program put there and what the link did with them
// (RoCE frames to the engine, ARP/ND, other and misqueued frames dropped,
// frames sent), the filter program's verdicts and the ARP/ND counters.
//
// Flags: -d NAME selects a device in the runtime dir, -s PATH a socket
// directly (default: the only device there is), -runtime-dir DIR, -json
// for machine-readable output.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/vrnic/vrnic/abi"
	"github.com/vrnic/vrnic/admin"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

var lists = map[string]abi.Cmd{
	"contexts": admin.ContextsCmd,
	"pds":      admin.PDsCmd,
	"mrs":      admin.MRsCmd,
	"cqs":      admin.CQsCmd,
	"qps":      admin.QPsCmd,
	"srqs":     admin.SRQsCmd,
	"ahs":      admin.AHsCmd,
	"hostmem":  admin.HostMemCmd,
	"accounts": admin.AccountsCmd,
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("vrnicctl", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dir := fs.String("runtime-dir", admin.RuntimeDir(), "runtime directory holding the device sockets")
	name := fs.String("d", "", "device name (socket <name>.sock in the runtime dir)")
	sock := fs.String("s", "", "control socket path")
	asJSON := fs.Bool("json", false, "JSON output")
	capOut := fs.String("w", "", "capture: write the pcapng to this file (- for standard output)")
	capCount := fs.Int("c", 0, "capture: stop after this many frames (0: no bound)")
	capFor := fs.Duration("t", 0, "capture: stop after this long (0: no bound; at least one of -c and -t)")
	capSnap := fs.Int("snaplen", 0, "capture: bytes kept of each frame (0: all)")
	bpfRoot := fs.String("bpffs", "/sys/fs/bpf", "tcfault: the BPF file system the injectors are pinned on (mounted there if it is not one)")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: vrnicctl [flags] devices|info|counters|link|cm|contexts|pds|mrs|cqs|qps|srqs|ahs|hostmem|accounts")
		fmt.Fprintln(stderr, "       vrnicctl [-d name|-s socket] -w FILE [-c N] [-t DURATION] [-snaplen N] capture")
		fmt.Fprintln(stderr, "       vrnicctl [-d name|-s socket] fault list|add|set|del|clear ...   (vrnicctl fault: its usage)")
		fmt.Fprintln(stderr, "       vrnicctl [-bpffs DIR] tcfault attach|add|list|clear|detach ...   (vrnicctl tcfault: its usage)")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() >= 1 && fs.Arg(0) == "fault" {
		path, err := pickSocket(*dir, *name, *sock)
		if err == nil {
			err = runFault(path, fs.Args()[1:], *asJSON, stdout)
		}
		if err != nil {
			fmt.Fprintln(stderr, "vrnicctl:", err)
			return 1
		}
		return 0
	}
	if fs.NArg() >= 1 && fs.Arg(0) == "tcfault" {
		if err := runTCFault(*bpfRoot, fs.Args()[1:], *asJSON, stdout); err != nil {
			fmt.Fprintln(stderr, "vrnicctl:", err)
			return 1
		}
		return 0
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return 2
	}
	cmd := fs.Arg(0)
	var err error
	switch {
	case cmd == "devices":
		err = devices(*dir, *asJSON, stdout)
	case cmd == "link":
		var path string
		if path, err = pickSocket(*dir, *name, *sock); err == nil {
			err = showLink(path, *asJSON, stdout)
		}
	case cmd == "cm":
		var path string
		if path, err = pickSocket(*dir, *name, *sock); err == nil {
			err = showCM(path, *asJSON, stdout)
		}
	case cmd == "capture":
		var path string
		if path, err = pickSocket(*dir, *name, *sock); err == nil {
			err = runCapture(path, *capOut, *capCount, *capFor, *capSnap, stdout, stderr)
		}
	case cmd == "info" || cmd == "counters" || lists[cmd] != 0:
		var path string
		if path, err = pickSocket(*dir, *name, *sock); err == nil {
			err = show(path, cmd, *asJSON, stdout)
		}
	default:
		fmt.Fprintf(stderr, "vrnicctl: unknown command %q\n", cmd)
		fs.Usage()
		return 2
	}
	if err != nil {
		fmt.Fprintln(stderr, "vrnicctl:", err)
		return 1
	}
	return 0
}

// sockets returns the device names and socket paths in dir.
func sockets(dir string) (map[string]string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		return nil, err
	}
	out := map[string]string{}
	for _, e := range ents {
		if e.Type()&os.ModeSocket == 0 || !strings.HasSuffix(e.Name(), admin.SocketSuffix) {
			continue
		}
		out[strings.TrimSuffix(e.Name(), admin.SocketSuffix)] = filepath.Join(dir, e.Name())
	}
	return out, nil
}

func pickSocket(dir, name, sock string) (string, error) {
	if sock != "" {
		return sock, nil
	}
	if name != "" {
		return admin.SocketPath(dir, name), nil
	}
	all, err := sockets(dir)
	if err != nil {
		return "", err
	}
	switch len(all) {
	case 0:
		return "", fmt.Errorf("no device sockets in %s (is vrnicd running? use -runtime-dir or -s)", dir)
	case 1:
		for _, p := range all {
			return p, nil
		}
	}
	names := make([]string, 0, len(all))
	for n := range all {
		names = append(names, n)
	}
	sort.Strings(names)
	return "", fmt.Errorf("several devices in %s (%s): choose one with -d", dir, strings.Join(names, ", "))
}

// DeviceEntry is one line of "vrnicctl devices".
type DeviceEntry struct {
	Name   string      `json:"name"`
	Socket string      `json:"socket"`
	Status string      `json:"status"` // "up" or the connection error
	Info   *admin.Info `json:"info,omitempty"`
}

func devices(dir string, asJSON bool, w io.Writer) error {
	all, err := sockets(dir)
	if err != nil {
		return err
	}
	names := make([]string, 0, len(all))
	for n := range all {
		names = append(names, n)
	}
	sort.Strings(names)
	out := []DeviceEntry{}
	for _, n := range names {
		e := DeviceEntry{Name: n, Socket: all[n], Status: "up"}
		if info, err := fetchInfo(all[n]); errors.Is(err, syscall.EPERM) {
			e.Status = "up (not an operator)"
		} else if err != nil {
			e.Status = "down: " + err.Error()
		} else {
			e.Info = &info
		}
		out = append(out, e)
	}
	if asJSON {
		return writeJSON(w, out)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "DEVICE\tSTATUS\tLINK\tCONTEXTS\tQPS\tSOCKET")
	for _, e := range out {
		if e.Info == nil {
			fmt.Fprintf(tw, "%s\t%s\t-\t-\t-\t%s\n", e.Name, e.Status, e.Socket)
			continue
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%s\n", e.Name, e.Status, e.Info.LinkType, e.Info.Resources.Contexts, e.Info.Resources.QP, e.Socket)
	}
	return tw.Flush()
}

func fetchInfo(path string) (admin.Info, error) {
	a, err := admin.Dial(path)
	if err != nil {
		return admin.Info{}, err
	}
	defer a.Close()
	return a.Info()
}

func show(path, what string, asJSON bool, w io.Writer) error {
	a, err := admin.Dial(path)
	if err != nil {
		return fmt.Errorf("connect %s: %w", path, err)
	}
	defer a.Close()
	if what == "info" || what == "counters" {
		info, err := a.Info()
		if err != nil {
			return err
		}
		if what == "counters" {
			c := map[string]int64{"connections": info.Connections}
			for k, v := range info.Counters {
				c[k] = v
			}
			r := info.Resources
			for k, v := range map[string]int{"contexts": r.Contexts, "host_mem": r.HostMem, "pd": r.PD, "mr": r.MR,
				"cq": r.CQ, "qp": r.QP, "srq": r.SRQ, "ah": r.AH, "mw": r.MW} {
				c["resources."+k] = int64(v)
			}
			for _, g := range counterGroups(info) {
				for _, kv := range g.fields {
					c[g.name+"."+kv.name] = int64(kv.value)
				}
			}
			if asJSON {
				return writeJSON(w, c)
			}
			keys := make([]string, 0, len(c))
			for k := range c {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
			for _, k := range keys {
				fmt.Fprintf(tw, "%s\t%d\n", k, c[k])
			}
			return tw.Flush()
		}
		if asJSON {
			return writeJSON(w, info)
		}
		return printInfo(w, info)
	}
	raw, err := a.List(lists[what])
	if err != nil {
		return err
	}
	if asJSON {
		if raw == nil {
			raw = []json.RawMessage{}
		}
		return writeJSON(w, raw)
	}
	if what == "accounts" {
		return printAccounts(w, raw)
	}
	return printTable(w, what, raw)
}

// printAccounts prints the per-uid accounts, with the user names of the
// uids where they resolve.
func printAccounts(w io.Writer, raw []json.RawMessage) error {
	if len(raw) == 0 {
		fmt.Fprintln(w, "no accounts")
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "UID\tUSER\tCONNECTIONS\tCONTEXTS\tHOSTMEM\tHOSTMEM_BYTES\tMRS\tMR_PAGES\tPDS\tCQS\tQPS\tSRQS\tAHS\tCM_IDS\tFDS\tREFUSED")
	for _, r := range raw {
		var a admin.AccountInfo
		if err := json.Unmarshal(r, &a); err != nil {
			return err
		}
		name := "-"
		if u, err := user.LookupId(strconv.FormatUint(uint64(a.UID), 10)); err == nil {
			name = u.Username
		}
		c := a.Resources
		fmt.Fprintf(tw, "%d\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\n", a.UID, name, a.Connections, c.Contexts,
			c.HostMem, a.HostMemBytes, c.MR, a.MRPages, c.PD, c.CQ, c.QP, c.SRQ, c.AH, a.CMIDs, a.FDs, a.Refused)
	}
	return tw.Flush()
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func printInfo(w io.Writer, i admin.Info) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "device\t%s\n", i.Device)
	fmt.Fprintf(tw, "abi\t%s\n", i.ABIVersion)
	fmt.Fprintf(tw, "link\t%s\n", i.LinkType)
	fmt.Fprintf(tw, "workers\t%d\n", i.Workers)
	if i.ECE != "" {
		fmt.Fprintf(tw, "ece\t%s\n", i.ECE)
	}
	if i.CongestionControl != "" {
		fmt.Fprintf(tw, "congestion_control\t%s\n", strings.TrimSpace(i.CongestionControl+" "+i.CCParams))
	}
	fmt.Fprintf(tw, "uptime\t%.0fs\n", i.UptimeSec)
	fmt.Fprintf(tw, "connections\t%d\n", i.Connections)
	r := i.Resources
	fmt.Fprintf(tw, "resources\tcontexts=%d hostmem=%d pd=%d mr=%d mw=%d cq=%d qp=%d srq=%d ah=%d\n",
		r.Contexts, r.HostMem, r.PD, r.MR, r.MW, r.CQ, r.QP, r.SRQ, r.AH)
	for _, g := range counterGroups(i) {
		words := make([]string, len(g.fields))
		for k, kv := range g.fields {
			words[k] = fmt.Sprintf("%s=%d", kv.name, kv.value)
		}
		fmt.Fprintf(tw, "%s\t%s\n", g.name, strings.Join(words, " "))
	}
	if len(i.RejectedWQEs) > 0 {
		words := make([]string, 0, len(i.RejectedWQEs))
		for _, k := range slices.Sorted(maps.Keys(i.RejectedWQEs)) {
			words = append(words, fmt.Sprintf("%s=%d", k, i.RejectedWQEs[k]))
		}
		fmt.Fprintf(tw, "rejected_wqes\t%s\n", strings.Join(words, " "))
	}
	if i.LastLinkError != "" {
		fmt.Fprintf(tw, "last_link_error\t%s (%s)\n", i.LastLinkError, i.LastLinkErrorAt.Format(time.RFC3339))
	}
	keys := make([]string, 0, len(i.Counters))
	for k := range i.Counters {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(tw, "%s\t%d\n", k, i.Counters[k])
	}
	return tw.Flush()
}

type counterField struct {
	name  string
	value uint64
}

// counterGroup is a named set of counters of admin.Info.
type counterGroup struct {
	name   string
	fields []counterField
}

// counterGroups returns the device's data-path totals and wire counters
// by their JSON names, in declaration order (the names -json uses).
func counterGroups(i admin.Info) []counterGroup {
	return []counterGroup{{"data_path", jsonFields(i.DataPath)}, {"wire", jsonFields(i.Wire)}, {"held", jsonFields(i.Held)}}
}

// jsonFields returns the unsigned fields of a counters struct by their
// JSON names, in declaration order.
func jsonFields(c any) []counterField {
	raw, err := json.Marshal(c)
	if err != nil {
		return nil
	}
	var m map[string]uint64
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil
	}
	var out []counterField
	for _, k := range jsonKeys(raw) {
		out = append(out, counterField{k, m[k]})
	}
	return out
}

// printTable prints list items as a table whose columns are the JSON
// fields of the first item (nested objects flattened as a.b).
func printTable(w io.Writer, what string, raw []json.RawMessage) error {
	if len(raw) == 0 {
		fmt.Fprintf(w, "no %s\n", what)
		return nil
	}
	var rows []map[string]string
	var cols []string
	for i, r := range raw {
		var m map[string]any
		dec := json.NewDecoder(strings.NewReader(string(r)))
		dec.UseNumber()
		if err := dec.Decode(&m); err != nil {
			return err
		}
		flat := map[string]string{}
		var order []string
		flatten("", m, flat, &order, r)
		if i == 0 {
			cols = order
		}
		rows = append(rows, flat)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, strings.ToUpper(strings.Join(cols, "\t")))
	for _, r := range rows {
		vals := make([]string, len(cols))
		for i, c := range cols {
			vals[i] = r[c]
			if vals[i] == "" {
				vals[i] = "-"
			}
		}
		fmt.Fprintln(tw, strings.Join(vals, "\t"))
	}
	return tw.Flush()
}

// flatten walks m in the key order of the raw JSON object.
func flatten(prefix string, m map[string]any, out map[string]string, order *[]string, raw []byte) {
	keys := jsonKeys(raw)
	for _, k := range keys {
		v := m[k]
		name := prefix + k
		if sub, ok := v.(map[string]any); ok {
			b, _ := json.Marshal(sub)
			// Re-encode to recover the nested key order from the raw text.
			var rawSub json.RawMessage
			var parent map[string]json.RawMessage
			if json.Unmarshal(raw, &parent) == nil {
				rawSub = parent[k]
			} else {
				rawSub = b
			}
			flatten(name+".", sub, out, order, rawSub)
			continue
		}
		*order = append(*order, name)
		out[name] = fmt.Sprint(v)
	}
}

// jsonKeys returns the keys of a JSON object in document order.
func jsonKeys(raw []byte) []string {
	dec := json.NewDecoder(strings.NewReader(string(raw)))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil
	}
	var keys []string
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return keys
		}
		keys = append(keys, t.(string))
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return keys
		}
	}
	return keys
}

// runCapture has the daemon capture its frames and writes the pcapng to
// out (a file, or stdout for "-"); it reports the frames written.
func runCapture(sock, out string, count int, d time.Duration, snap int, stdout, stderr io.Writer) error {
	if out == "" {
		return errors.New("capture: -w FILE is required")
	}
	if count <= 0 && d <= 0 {
		return errors.New("capture: give -c N or -t DURATION (or both)")
	}
	a, err := admin.Dial(sock)
	if err != nil {
		return err
	}
	defer a.Close()
	src, err := a.Capture(admin.CaptureRequest{Count: count, Seconds: d.Seconds(), Snaplen: snap})
	if err != nil {
		return err
	}
	defer src.Close()
	var w io.Writer = stdout
	if out != "-" {
		f, err := os.Create(out)
		if err != nil {
			return err
		}
		defer f.Close()
		w = f
	}
	n, err := io.Copy(w, src)
	if err != nil {
		return fmt.Errorf("capture: %w", err)
	}
	if out != "-" {
		fmt.Fprintf(stderr, "vrnicctl: wrote %d bytes of pcapng to %s\n", n, out)
	}
	return nil
}
