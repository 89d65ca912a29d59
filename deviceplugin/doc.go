// Package deviceplugin is the Kubernetes device plugin of a node's vrnic
// devices: it advertises every vrnicd of the node as one device of an
// extended resource (DefaultResourceName, "vrnic.io/rdma") and gives a
// container that is granted devices what it needs to use them with
// unmodified RDMA software. cmd/vrnic-device-plugin runs it.
//
// # The kubelet's device plugin API (v1beta1)
//
// The kubelet and a plugin talk gRPC over unix sockets in the kubelet's
// device plugin directory, /var/lib/kubelet/device-plugins/. References:
// the API, k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1/api.proto (its
// comments are the contract); the Kubernetes documentation's "Device
// Plugins" page (concepts/extend-kubernetes/compute-storage-net); the
// original design, resource-management/device-plugin.md in the
// kubernetes/design-proposals-archive repository; the kubelet's side,
// pkg/kubelet/cm/devicemanager in kubernetes/kubernetes (manager.go,
// endpoint.go).
//
//  1. Registration. The kubelet serves the Registration service on
//     kubelet.sock. The plugin first serves its own DevicePlugin service
//     on a socket of its own in the same directory (here vrnic.sock),
//     then calls Register with the API version ("v1beta1"), that
//     socket's file name (the endpoint), the resource name and its
//     options (whether the kubelet must call PreStartContainer before
//     each container and whether GetPreferredAllocation is offered: both
//     false here).
//  2. The kubelet then dials the endpoint, calls GetDevicePluginOptions
//     and opens ListAndWatch: a server stream on which the plugin sends
//     the whole list of its devices (ID and health, Healthy or
//     Unhealthy) at once and again whenever anything changes. The node's
//     capacity for the resource is the number of devices listed, its
//     allocatable the healthy ones; the scheduler places pods by them.
//  3. When a pod that asks for the resource (resources.limits, an
//     integer; requests may be left out or must equal the limit) is
//     admitted on the node, the kubelet picks healthy unallocated devices
//     and calls Allocate with their IDs, per container. The reply per
//     container holds environment variables, bind mounts (host path,
//     container path, read-only) and device nodes (host path, container
//     path, cgroup permissions), which the kubelet passes to the
//     container runtime (CRI) with the container's spec. A failed
//     Allocate fails the pod's admission (UnexpectedAdmissionError).
//  4. There is no release call: the kubelet forgets the devices when the
//     container is gone and may hand them out again.
//  5. When the kubelet restarts it deletes every socket of its directory
//     and serves a new kubelet.sock; a plugin notices (here: the
//     identity of kubelet.sock, or its own socket gone, checked every
//     PollInterval) and serves and registers again. Devices keep their
//     IDs, so running pods keep theirs.
//
// # What vrnic advertises
//
// A device is a control socket NAME.sock in the runtime directory (the
// daemons' directory, /run/vrnic): its ID is the daemon's name. It is
// Healthy while the daemon answers the operator INFO command on it. The
// plugin holds one connection per daemon, asks INFO every HealthInterval
// and between the asks waits on the connection, so a daemon's exit, which
// closes it, is on the stream within milliseconds; a daemon that stops
// answering is Unhealthy within HealthInterval + CallTimeout, and one that
// comes back (its socket answers again) is Healthy within PollInterval. A
// device once seen stays listed (Unhealthy while its daemon is away) until
// the plugin restarts.
//
// # What a container gets
//
// Allocate (allocate.go) gives what vrnic-run gives a program: the drop-in
// libibverbs.so.1 and librdmacm.so.1 first on LD_LIBRARY_PATH,
// VRNIC_RUNTIME_DIR naming a directory that lists the container's devices'
// sockets and nothing else, and the devices' system view from
// internal/devview (the same code vrnic-run uses): /dev/infiniband/uverbsN
// nodes (the host's /dev/null, which is all UCX opens them for), the
// sysfs classes infiniband and infiniband_verbs (Config.SysfsView), and,
// since a pod's network namespace holds none of the daemons' addresses, a
// synthetic interface per device through the preloaded interface shim
// (LD_PRELOAD, VRNIC_NETDEVS). What vrnic-run's mount namespace does at
// run time (bind mounts over /dev and /sys/class) is the container
// runtime's work here: the plugin writes the files on the node, under
// StateDir, and names them as mounts.
//
// The container's processes are the daemon's clients like any other
// local process: the daemon sees their uid through SO_PEERCRED and applies
// its per-uid limits to them; a process running as root in the pod (uid 0
// in the node's user namespace) is an operator of the daemon, as root is on
// the node: run pods as another uid (deploy/k8s/example-pod.yaml).
package deviceplugin
