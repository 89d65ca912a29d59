package faults

import (
	"time"

	"github.com/vrnic/vrnic/device/engine"
)

// Verb-level faults (action verb): they strike inside the transport, at
// the points engine.VerbPoint names, rather than on frames. The Injector
// is the engine's engine.VerbFaults while at least one verb rule is
// enabled (AttachEngine), and takes the port down and up for port_flap
// (AttachPort): the port's frames are dropped by the fault layer of
// every link meanwhile, and the device raises PORT_ERR and PORT_ACTIVE.

// VerbTarget is the engine the verb faults are installed on.
type VerbTarget interface {
	SetVerbFaults(engine.VerbFaults)
}

var _ VerbTarget = (*engine.Engine)(nil)

// verbPoints maps the verb names to the engine's points (port_flap has
// none: the Injector runs it).
var verbPoints = map[string]engine.VerbPoint{
	"rnr": engine.VerbRNR, "qp_err": engine.VerbQPErr, "bad_wqe": engine.VerbBadWQE,
	"cq_overflow": engine.VerbCQOverflow, "cqe_delay": engine.VerbCQEDelay,
}

// AttachEngine makes e ask the verb rules (from now on, and after every
// change of the rules).
func (inj *Injector) AttachEngine(e VerbTarget) {
	inj.mu.Lock()
	defer inj.mu.Unlock()
	inj.eng = e
	inj.publish()
}

// AttachPort sets what moves the device's port down (false) and up
// (true) for port_flap: the device's SetPort.
func (inj *Injector) AttachPort(set func(up bool)) {
	inj.mu.Lock()
	defer inj.mu.Unlock()
	inj.port = set
}

// VerbFault implements engine.VerbFaults: the first enabled verb rule of
// point p whose qpn and cq filters match, inside its time window, drawn
// by its probability and within its count, strikes.
func (inj *Injector) VerbFault(p engine.VerbPoint, qpn, cq uint32) (time.Duration, bool) {
	vs := inj.verbs.Load()
	if vs == nil {
		return 0, false
	}
	var now int64
	for _, r := range *vs {
		if r.point != p || r.qpn >= 0 && int64(qpn) != r.qpn || r.cq >= 0 && int64(cq) != r.cq {
			continue
		}
		r.matched.Add(1)
		if now == 0 {
			now = inj.now()
		}
		if t := now - r.installed; t < r.after || r.until > 0 && t >= r.until {
			continue
		}
		if !r.draw() || !r.take() {
			continue
		}
		if n := r.logged.Add(1); n <= inj.cfg.LogLimit {
			inj.cfg.Logger.Info("fault injected", "rule", r.id, "action", "verb", "verb", r.act.verb, "qpn", qpn, "cq", cq)
		}
		return time.Duration(r.act.delay), true
	}
	return 0, false
}

// portDown reports whether a port_flap rule holds the port down at now:
// every frame is dropped.
func (r *rule) portDown(now int64) bool {
	return r.port && now >= r.downFrom && now < r.downUntil.Load()
}

// startFlap schedules a port_flap rule's period (inj.mu held): down
// after its after, up again for later.
func (inj *Injector) startFlap(r *rule) {
	r.downFrom = r.installed + r.after
	r.downUntil.Store(r.downFrom + r.act.hold)
	r.flapDown = time.AfterFunc(time.Duration(r.after), func() {
		r.applied.Add(1)
		inj.cfg.Logger.Info("fault injected", "rule", r.id, "action", "verb", "verb", "port_flap", "down_for", time.Duration(r.act.hold))
		inj.setPort(false)
	})
	r.flapUp = time.AfterFunc(time.Duration(r.after+r.act.hold), func() {
		inj.cfg.Logger.Info("port up again", "rule", r.id)
		inj.setPort(true)
	})
}

// stopFlap ends a port_flap rule that is removed or replaced (inj.mu
// held): a port it holds down comes up now.
func (inj *Injector) stopFlap(r *rule) {
	if !r.port {
		return
	}
	r.flapDown.Stop()
	if r.flapUp.Stop() {
		r.downUntil.Store(0)
		if inj.now() >= r.downFrom {
			go inj.setPort(true)
		}
	}
}

// setPort moves the port through AttachPort's function, if set.
func (inj *Injector) setPort(up bool) {
	inj.mu.Lock()
	set := inj.port
	inj.mu.Unlock()
	if set != nil {
		set(up)
	}
}
