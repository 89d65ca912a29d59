// Package cm is the InfiniBand Communication Manager (IBTA vol. 1,
// chapter 12) of vrnic: the protocol rdma_cm programs and Linux hosts
// (Soft-RoCE included) use to connect RC and UC QPs and to resolve UD
// service IDs. Its semantics are Linux's (ib_cm, rdma_cm, librdmacm).
//
// # States of a connection
//
//	                          active side                          passive side
//	                             IDLE                                  IDLE
//	              Connect: REQ ──►│                                     │◄── REQ (listener): EventConnectRequest
//	                          REQ_SENT ──MRA──► MRA_REQ_RCVD        REQ_RCVD ──MRA──► MRA_REQ_SENT
//	                     REP: EventREPReceived │                        │ Accept: REP
//	                          REP_RCVD ──MRA──► MRA_REP_SENT        REP_SENT ──MRA──► MRA_REP_RCVD
//	                       RTU ──►│                                     │◄── RTU (or a packet: NotifyEstablished)
//	                              └──────────► ESTABLISHED ◄────────────┘
//	                 Disconnect: DREQ ──►│            │◄── DREQ: EventDisconnectRequest
//	                                 DREQ_SENT    DREQ_RCVD
//	                        DREP (or timeout) │            │ Disconnect: DREP
//	                                          └─► TIMEWAIT ◄┘ ──timer──► IDLE (forgotten)
//
//	SIDR: IDLE ──SIDRRequest──► SIDR_REQ_SENT ──SIDR_REP──► IDLE
//	      IDLE ──SIDR_REQ────► SIDR_REQ_RCVD ──SIDRReply──► IDLE
//
// A REJ, or a request that got no answer after its retries, returns a
// handshake to IDLE (a stale connection REJ, or one after REP_SENT, goes
// through TIMEWAIT); Destroy ends a connection from any state (recv.go,
// manager.go: every transition is in the function of the message or call
// that causes it).
//
// # Parts
//
// Service (service*.go) is the CM of one device: one goroutine and one
// inbox own a Manager and the CM IDs of every client, so neither has a
// lock and the order of events is the order of the inbox: client commands
// (the CM_* commands of the ABI, routed by the device through its CM
// interface), MADs from QP1 (HandleMAD, called by QP1's engine worker: it
// copies the MAD into the inbox and never blocks), timer expiries (the
// Manager's Clock posts them) and the release of a context. Events go to
// the clients' event sockets as struct vrnic_cm_event (struct
// vrnic_cm_event_ece for IDs that negotiate ECE). Errors keep their
// cause and carry the errno the client gets.
//
// Manager (manager.go, recv.go, conn.go, qpattr.go) is transport-agnostic:
// it builds and parses MADs and runs the state machines; it belongs to one
// goroutine.
//
// # Wire format
//
// A CM message is a 256-byte MAD (management class 0x07, class version 2,
// method Send) sent as a UD datagram to QP1 with P_Key 0xFFFF and Q_Key
// 0x80010000 (QP1QKey). mad.go holds the common MAD header and Encode /
// Decode; messages.go holds REQ, MRA, REJ, REP, RTU, DREQ, DREP, SIDR_REQ
// and SIDR_REP with every field at its IBTA byte and bit position. Decode
// refuses anything but a whole, well-formed CM MAD with an error (never a
// panic; see the fuzz test).
//
// ece.go holds Enhanced Connection Establishment: vrnic's own transport
// options of an RC connection, offered in the REQ and agreed in the REP
// with vrnic's vendor ID (the REQ's and REP's Vendor ID fields and the
// MAD header's attribute modifier, as Linux carries struct ib_cm_ece);
// QPAttr(RTR).ECE gives each side the agreed options. A peer without ECE
// sees a REQ that differs only in those fields and gets the REP it would
// get without ECE.
//
// cma.go holds the rdma_cm conventions on top: service IDs (port space
// << 16 | port), the cma_hdr at the front of REQ and SIDR_REQ private
// data, and the path rdma_cm builds for RoCE v2 (IPv4-mapped GIDs,
// permissive LIDs, hop limit, traffic class, flow label from the ports).
//
// # Plugging a Manager in
//
// The owner (the Service, per port) creates a Manager with a Sender (send
// a MAD to QP1 of the port with a given GID), a Clock (SystemClock, or a
// FakeClock in tests) and a Handler for events, and feeds it every MAD
// its QP1 receives with HandleMAD(sourceGID, mad). It drives connections
// with Listen (or ListenBacklog), Connect, Accept, Reject, MRA, RTU,
// NotifyEstablished, Disconnect, Destroy, SIDRRequest and SIDRReply, and
// reads the QP attributes for INIT, RTR and RTS with QPAttr (what
// rdma_init_qp_attr returns). The Manager never modifies a QP; it says
// what to do through events:
//
//	event                   owner (as rdma_cm does)
//	EventConnectRequest     create a QP, INIT/RTR/RTS from QPAttr, Accept (or Reject, or MRA)
//	EventREPReceived        RTR/RTS from QPAttr, then RTU (or Reject)
//	EventEstablished        connection usable
//	EventRejected           report REJECTED (consumer reject: Reason 28 + PrivateData;
//	                        a half-open request shed or expired: 3 or 4)
//	EventDisconnectRequest  QP to ERROR, then Disconnect (sends the DREP)
//	EventDisconnected       QP to ERROR
//	EventTimeWaitExit       the QPN may be reused
//	EventUnreachable        report UNREACHABLE
//	EventSIDRRequest        SIDRReply
//	EventSIDRReply          UD peer resolved (or not: Status)
//
// # PSNs, path MTU and depths
//
// These follow Linux (ib_cm cm.c, rdma_cm cma.c), which the captures of
// two Soft-RoCE hosts in testdata/rxe confirm (golden_rxe_test.go):
//
//   - The Starting PSN a side puts in its REQ or REP is the PSN it
//     expects to receive, its QP's RQ PSN; the other side sends from it
//     (its SQ PSN). The active side's comes from ConnectParams (rdma_cm:
//     the ID's random seq_num); the passive side's is drawn when the REQ
//     arrives (rdma_cm: the new connection ID's seq_num), QPAttr's RTR
//     gives it, and Accept must announce it in the REP. RTS's SQPSN is
//     the REQ's Starting PSN on the passive side (cm_req_handler) and the
//     REP's on the active side (cm_rep_handler).
//   - The REQ offers the smaller of the route's MTU and the port's
//     (Config.PortMTU); the passive side's QP uses the smaller of the
//     REQ's and its port's.
//   - Each side's initiator depth is the peer's responder resources and
//     the other way round (cm_req_handler, cm_rep_handler); QPAttr clamps
//     them to the device's max_qp_init_rd_atom and max_qp_rd_atom
//     (Config.MaxInitRdAtomic, Config.MaxRdAtomic) rather than giving
//     attributes the device refuses.
//
// # States
//
// Active side: IDLE → REQ_SENT [→ MRA_REQ_RCVD] → REP_RCVD [→
// MRA_REP_SENT] → ESTABLISHED. Passive side: IDLE → REQ_RCVD [→
// MRA_REQ_SENT] → REP_SENT [→ MRA_REP_RCVD] → ESTABLISHED. Then
// ESTABLISHED → DREQ_SENT or DREQ_RCVD → TIMEWAIT → IDLE. SIDR:
// SIDR_REQ_SENT and SIDR_REQ_RCVD. A REJ or a timeout during the
// handshake returns to IDLE (a stale connection REJ, or one after REP_SENT,
// goes through TIMEWAIT). A connection back in IDLE is forgotten.
//
// # Demultiplexing and duplicates
//
// Received messages find their connection by local comm ID (checked
// against the peer's comm ID), a REQ by the peer's comm ID and CA GUID
// (repeats), by the peer's QPN and CA GUID (stale connections), and by
// service ID (listeners). Unlike Linux, every one of these lookups also
// takes the MAD's source GID (HandleMAD's src): a message acts on a
// connection only if it comes from the connection's peer. A REQ from
// another address that names an existing connection's peer IDs or QPN is
// a new request for the listener (or a REJ, invalid service ID); an MRA,
// REJ, REP, RTU, DREQ, DREP or SIDR_REP from another address is counted
// unmatched and changes nothing (a DREQ gets the DREP built from it that
// any DREQ for an unknown connection gets, so the answer tells nothing).
// Repeats are answered per state, as Linux does: a repeated REQ gets the
// MRA again (MRA_REQ_SENT), the REP again (REP_SENT, MRA_REP_RCVD) or a
// stale connection REJ (TIMEWAIT); a repeated REP gets the RTU or MRA
// again; a repeated DREQ gets the DREP again (TIMEWAIT) or, for a
// connection already forgotten, a DREP built from the DREQ. A REQ from a
// peer QP that already has a connection here, from the same address, is
// rejected (stale connection) and the old connection gets a DREQ; no
// listener: REJ invalid service ID; a transport other than RC and UC:
// REJ invalid transport type.
//
// Comm IDs are drawn from ChaCha8 seeded from the OS random source
// (Config.Seed for reproducible tests), nonzero and held by no other
// connection, TimeWait included: one ID tells nothing of another (Linux
// allocates them cyclically under a random XOR, so consecutive IDs differ
// in their low bits). A transaction ID is a random high word and the
// local comm ID (Linux cm_form_tid: the MAD agent's number and the comm
// ID).
//
// # Half-open connections
//
// A passive connection is half open from its REQ (or SIDR_REQ) until it
// is established: unanswered (REQ_RCVD, MRA_REQ_SENT, SIDR_REQ_RCVD) or
// answered (REP_SENT, MRA_REP_RCVD). Anyone can make them, from any
// address, so they are bounded (halfopen.go): at most the listener's
// backlog (ListenBacklog; DefaultBacklog for Listen) and
// Config.MaxHalfOpen (DefaultMaxHalfOpen) for the whole Manager. A
// request that finds a bound reached sheds the oldest answered one (REJ
// no resources, TimeWait: a genuine peer answers a REP with an RTU within
// a round trip, a forged source never does), else the oldest unanswered
// one (no REJ: its peer repeats its REQ, which is then a new request),
// and is admitted; the owner gets EventRejected with RejectNoResources.
// An unanswered request expires once its active side has given up: its
// REQ's Max CM Retries + 1 times its REQ timeout (or the wait an MRA
// asks for, once one went out) plus a round trip, at most
// Config.MaxHalfOpenTime (DefaultMaxHalfOpenTime, 2 minutes); its peer
// gets a REJ (no resources), the owner EventRejected with RejectTimeout
// and the peer's CA GUID as ARI, as when an active side gives up. An
// answered one is given up on (EventUnreachable) at most MaxHalfOpenTime
// after its REP. Stats reports HalfOpen, Shed and Expired.
//
// # Timers
//
// REQ, REP, DREQ and SIDR_REQ are repeated until answered, up to the
// REQ's Max CM Retries times, each after the same timeout, with Linux's
// arithmetic (IBADuration: 2^max(t-8,0) ms for 4.096 µs × 2^t): REQ 2 ×
// packet life time + remote CM response timeout; REP and the passive
// DREQ the REQ's local CM response timeout; an MRA stretches the wait to
// its service timeout plus the path's ACK timeout. With rdma_cm's values
// over RoCE (packet life time 16, response timeout 20, 15 retries) a REQ
// waits 4.608 s per attempt and the peer is unreachable after 73.7 s.
// TimeWait lasts the path's ACK timeout (cm_ack_timeout of the CA ACK
// delay and packet life time: 2^(17-8) ms with rxe's values); during it
// the connection keeps its local comm ID and its local QPN
// (QPNInTimeWait).
//
// What a peer's messages ask of these timers is clamped (timeout.go),
// where Linux takes it as it comes (a REQ could keep a REP repeating for
// 37 hours): the REQ's local CM response timeout at most
// MaxPeerResponseTimeout (23: 32.8 s per attempt), its Max CM Retries at
// most what fits MaxHalfOpenTime (2 retries at 32.8 s, all 15 at
// rdma_cm's 4.1 s), an MRA's service timeout at most
// MaxPeerServiceTimeout (24, rdma_cm's own: 67 s), the ACK timeout where
// it sets TimeWait or an MRA's round trip at most MaxPeerACKTimeout (21:
// 8.4 s). rdma_cm's and rxe's values pass unchanged.
//
// # Concurrency
//
// A Manager has no lock: its owner (the Service's goroutine, or a test)
// makes every call and runs its timers. MADs and events a call produces
// are queued and handed to the Sender and the Handler when the call ends,
// in order; both may call back into the Manager.
//
// # Not implemented
//
//   - LAP and APR (alternate path load and response, path migration):
//     decoded as unsupported, counted and ignored, as Linux does on RoCE
//     ports. REQs are sent without an alternate path and one in a
//     received REQ is not used.
//   - RD (reliable datagram, EECs) and XRC: a REQ for them is rejected
//     (invalid transport type).
//   - ClassPortInfo and CM redirection (REJ port redirect).
//   - Peer-to-peer connection establishment (both sides sending REQs to
//     each other's service).
//   - A SIDR_REQ repeated after its SIDR_REP is treated as a new request
//     (as in Linux; the answer is the same).
package cm
