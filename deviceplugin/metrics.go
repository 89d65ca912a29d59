package deviceplugin

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// counters are the plugin's event counts (metrics.go).
type counters struct {
	registrations atomic.Uint64 // successful Register calls
	registered    atomic.Bool   // serving a kubelet it registered with
	allocated     atomic.Uint64 // containers given devices
	refused       atomic.Uint64 // container allocations refused
	streams       atomic.Int64  // ListAndWatch streams open
}

var (
	descDeviceHealthy = prometheus.NewDesc("vrnic_plugin_device_healthy",
		"1 while the daemon answers on its control socket, else 0.", []string{"device"}, nil)
	descDeviceDown = prometheus.NewDesc("vrnic_plugin_device_unhealthy_transitions_total",
		"Times the daemon was seen to go from healthy to unhealthy.", []string{"device"}, nil)
	descAdvertised = prometheus.NewDesc("vrnic_plugin_advertised_devices",
		"Devices listed to the kubelet (each daemon's shares), by health.", []string{"health"}, nil)
	descRegistrations = prometheus.NewDesc("vrnic_plugin_kubelet_registrations_total",
		"Successful registrations with the kubelet (one at start, one after each kubelet restart).", nil, nil)
	descRegistered = prometheus.NewDesc("vrnic_plugin_kubelet_registered",
		"1 while the plugin serves a kubelet it registered with.", nil, nil)
	descAllocations = prometheus.NewDesc("vrnic_plugin_allocations_total",
		"Containers the kubelet asked devices for, by result (allocated, refused).", []string{"result"}, nil)
	descStreams = prometheus.NewDesc("vrnic_plugin_list_and_watch_streams",
		"ListAndWatch streams open (1 with a kubelet connected).", nil, nil)
)

// Collector returns a prometheus.Collector of the plugin's state and
// events; each scrape reads one snapshot of the device table.
func (p *Plugin) Collector() prometheus.Collector { return pluginCollector{p} }

type pluginCollector struct{ p *Plugin }

func (c pluginCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descDeviceHealthy, descDeviceDown, descAdvertised, descRegistrations,
		descRegistered, descAllocations, descStreams} {
		ch <- d
	}
}

func (c pluginCollector) Collect(ch chan<- prometheus.Metric) {
	p := c.p
	devs, downs := p.devs.stats()
	healthy, unhealthy := 0, 0
	for _, d := range devs {
		v := 0.0
		if d.Healthy {
			v = 1
			healthy += p.cfg.Shares
		} else {
			unhealthy += p.cfg.Shares
		}
		ch <- prometheus.MustNewConstMetric(descDeviceHealthy, prometheus.GaugeValue, v, d.Name)
		ch <- prometheus.MustNewConstMetric(descDeviceDown, prometheus.CounterValue, float64(downs[d.Name]), d.Name)
	}
	ch <- prometheus.MustNewConstMetric(descAdvertised, prometheus.GaugeValue, float64(healthy), "healthy")
	ch <- prometheus.MustNewConstMetric(descAdvertised, prometheus.GaugeValue, float64(unhealthy), "unhealthy")
	ch <- prometheus.MustNewConstMetric(descRegistrations, prometheus.CounterValue, float64(p.count.registrations.Load()))
	reg := 0.0
	if p.count.registered.Load() {
		reg = 1
	}
	ch <- prometheus.MustNewConstMetric(descRegistered, prometheus.GaugeValue, reg)
	ch <- prometheus.MustNewConstMetric(descAllocations, prometheus.CounterValue, float64(p.count.allocated.Load()), "allocated")
	ch <- prometheus.MustNewConstMetric(descAllocations, prometheus.CounterValue, float64(p.count.refused.Load()), "refused")
	ch <- prometheus.MustNewConstMetric(descStreams, prometheus.GaugeValue, float64(p.count.streams.Load()))
}
