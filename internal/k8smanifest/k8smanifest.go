// Package k8smanifest reads the Kubernetes manifests of deploy/k8s into
// the few fields the repository's tests check against the code: the
// containers of DaemonSets, Pods and Jobs, their commands, security
// contexts, volume mounts and resource limits, and the host paths of their
// volumes. It is no Kubernetes client: fields it does not model are
// ignored.
package k8smanifest

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Object is one document of a manifest file.
type Object struct {
	APIVersion string   `yaml:"apiVersion"`
	Kind       string   `yaml:"kind"`
	Metadata   Metadata `yaml:"metadata"`
	Spec       struct {
		// DaemonSet, Job: the pod template.
		Template struct {
			Metadata Metadata `yaml:"metadata"`
			Spec     PodSpec  `yaml:"spec"`
		} `yaml:"template"`
		PodSpec `yaml:",inline"` // Pod
	} `yaml:"spec"`
	Data map[string]string `yaml:"data"` // ConfigMap
}

// Metadata is an object's name, namespace, labels and annotations.
type Metadata struct {
	Name        string            `yaml:"name"`
	Namespace   string            `yaml:"namespace"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

// PodSpec is the part of a pod's spec the tests read.
type PodSpec struct {
	HostNetwork     bool                `yaml:"hostNetwork"`
	SecurityContext *PodSecurityContext `yaml:"securityContext"`
	Containers      []Container         `yaml:"containers"`
	Volumes         []Volume            `yaml:"volumes"`
}

// PodSecurityContext is a pod's security context.
type PodSecurityContext struct {
	RunAsUser          *int64  `yaml:"runAsUser"`
	RunAsGroup         *int64  `yaml:"runAsGroup"`
	SupplementalGroups []int64 `yaml:"supplementalGroups"`
}

// Container is one container of a pod.
type Container struct {
	Name            string           `yaml:"name"`
	Image           string           `yaml:"image"`
	Command         []string         `yaml:"command"`
	Args            []string         `yaml:"args"`
	Env             []EnvVar         `yaml:"env"`
	SecurityContext *SecurityContext `yaml:"securityContext"`
	VolumeMounts    []VolumeMount    `yaml:"volumeMounts"`
	Resources       struct {
		Limits   map[string]string `yaml:"limits"`
		Requests map[string]string `yaml:"requests"`
	} `yaml:"resources"`
}

// EnvVar is a container's environment variable (its value or where it
// comes from).
type EnvVar struct {
	Name      string `yaml:"name"`
	Value     string `yaml:"value"`
	ValueFrom *struct {
		FieldRef *struct {
			FieldPath string `yaml:"fieldPath"`
		} `yaml:"fieldRef"`
	} `yaml:"valueFrom"`
}

// SecurityContext is a container's security context.
type SecurityContext struct {
	RunAsUser                *int64 `yaml:"runAsUser"`
	RunAsGroup               *int64 `yaml:"runAsGroup"`
	Privileged               *bool  `yaml:"privileged"`
	AllowPrivilegeEscalation *bool  `yaml:"allowPrivilegeEscalation"`
	Capabilities             *struct {
		Add  []string `yaml:"add"`
		Drop []string `yaml:"drop"`
	} `yaml:"capabilities"`
}

// VolumeMount is a container's mount of a pod volume.
type VolumeMount struct {
	Name      string `yaml:"name"`
	MountPath string `yaml:"mountPath"`
	ReadOnly  bool   `yaml:"readOnly"`
}

// Volume is a pod volume: a host path, a ConfigMap, or another kind the
// tests do not read.
type Volume struct {
	Name     string `yaml:"name"`
	HostPath *struct {
		Path string `yaml:"path"`
		Type string `yaml:"type"`
	} `yaml:"hostPath"`
	ConfigMap *struct {
		Name string `yaml:"name"`
	} `yaml:"configMap"`
}

// Load reads every document of the manifest file path.
func Load(path string) ([]Object, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	var out []Object
	for i := 0; ; i++ {
		var o Object
		err := dec.Decode(&o)
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%s: document %d: %w", path, i+1, err)
		}
		if o.Kind == "" || o.APIVersion == "" || o.Metadata.Name == "" {
			return nil, fmt.Errorf("%s: document %d: no kind, apiVersion or metadata.name", path, i+1)
		}
		out = append(out, o)
	}
}

// Pod returns the pod spec of o: its own for a Pod, its template's for a
// DaemonSet, Deployment or Job; nil for other kinds.
func (o *Object) Pod() *PodSpec {
	switch o.Kind {
	case "Pod":
		return &o.Spec.PodSpec
	case "DaemonSet", "Deployment", "Job", "StatefulSet":
		return &o.Spec.Template.Spec
	}
	return nil
}

// Container returns the container of p named name, or nil.
func (p *PodSpec) Container(name string) *Container {
	for i := range p.Containers {
		if p.Containers[i].Name == name {
			return &p.Containers[i]
		}
	}
	return nil
}

// HostPathOf returns the host path of the volume mounted at mountPath in
// c, or "" if it is not a host path volume.
func (p *PodSpec) HostPathOf(c *Container, mountPath string) string {
	for _, m := range c.VolumeMounts {
		if m.MountPath != mountPath {
			continue
		}
		for _, v := range p.Volumes {
			if v.Name == m.Name && v.HostPath != nil {
				return v.HostPath.Path
			}
		}
	}
	return ""
}

// ExpandArgs returns c's command line (command then args) with $(VAR)
// references to its environment replaced by vals[VAR], as the kubelet
// expands them from the values it resolves.
func (c *Container) ExpandArgs(vals map[string]string) []string {
	var out []string
	for _, a := range append(append([]string{}, c.Command...), c.Args...) {
		for _, e := range c.Env {
			if v, ok := vals[e.Name]; ok {
				a = replaceAll(a, "$("+e.Name+")", v)
			}
		}
		out = append(out, a)
	}
	return out
}

func replaceAll(s, old, new string) string {
	return strings.ReplaceAll(s, old, new)
}
