// sluice-kubecheck: Kubernetes manifests checked offline against the API's own Go types.
//
// Each YAML document read (files named on the command line) is decoded into the type the Kubernetes API defines
// for its apiVersion and kind (k8s.io/api; the Prometheus Operator's monitoring/v1 for a ServiceMonitor), strictly:
// a field the type does not have (a typo, a field of a newer Kubernetes, one in the wrong place), a value of the
// wrong type or a duplicate key fails the document. These types are what the API server's OpenAPI schema is
// generated from. On top of that, the rules of the features the chart relies on that no type expresses: a
// container's restartPolicy only on an init container and only "Always" (the native sidecar, Kubernetes 1.29+),
// probes and ports that name existing container ports, every container named once, a preStop hook with one action.
// No cluster is needed; nothing is applied anywhere.
//
// Exit code 0 when every document passed, 1 otherwise (each problem printed as FILE: KIND/NAME: problem).
package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	yamlutil "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

type header struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name string `json:"name"`
	} `json:"metadata"`
}

func newObject(apiVersion, kind string) (any, error) {
	switch apiVersion + "/" + kind {
	case "v1/ConfigMap":
		return &corev1.ConfigMap{}, nil
	case "v1/Secret":
		return &corev1.Secret{}, nil
	case "v1/Service":
		return &corev1.Service{}, nil
	case "v1/ServiceAccount":
		return &corev1.ServiceAccount{}, nil
	case "v1/Pod":
		return &corev1.Pod{}, nil
	case "apps/v1/Deployment":
		return &appsv1.Deployment{}, nil
	case "apps/v1/StatefulSet":
		return &appsv1.StatefulSet{}, nil
	case "policy/v1/PodDisruptionBudget":
		return &policyv1.PodDisruptionBudget{}, nil
	case "monitoring.coreos.com/v1/ServiceMonitor":
		return &monitoringv1.ServiceMonitor{}, nil
	}
	return nil, fmt.Errorf("no type known here for apiVersion %q kind %q", apiVersion, kind)
}

func podSpecOf(obj any) *corev1.PodSpec {
	switch o := obj.(type) {
	case *corev1.Pod:
		return &o.Spec
	case *appsv1.Deployment:
		return &o.Spec.Template.Spec
	case *appsv1.StatefulSet:
		return &o.Spec.Template.Spec
	}
	return nil
}

func checkPort(c *corev1.Container, port intstr.IntOrString, what string) error {
	for _, p := range c.Ports {
		if (port.Type == intstr.String && p.Name == port.StrVal) || (port.Type == intstr.Int && p.ContainerPort == port.IntVal) {
			return nil
		}
	}
	return fmt.Errorf("container %s: %s names port %s, which the container does not declare", c.Name, what, port.String())
}

func checkHandler(c *corev1.Container, h *corev1.ProbeHandler, what string) error {
	n := 0
	if h.Exec != nil {
		n++
	}
	if h.HTTPGet != nil {
		n++
		if err := checkPort(c, h.HTTPGet.Port, what); err != nil {
			return err
		}
	}
	if h.TCPSocket != nil {
		n++
	}
	if h.GRPC != nil {
		n++
	}
	if n != 1 {
		return fmt.Errorf("container %s: %s must have exactly one handler, has %d", c.Name, what, n)
	}
	return nil
}

func checkContainer(c *corev1.Container, init bool) []error {
	var errs []error
	if c.Name == "" || c.Image == "" {
		errs = append(errs, fmt.Errorf("a container needs a name and an image (name %q)", c.Name))
	}
	if c.RestartPolicy != nil {
		if !init {
			errs = append(errs, fmt.Errorf("container %s: restartPolicy is only allowed on init containers", c.Name))
		} else if *c.RestartPolicy != corev1.ContainerRestartPolicyAlways {
			errs = append(errs, fmt.Errorf("container %s: an init container's restartPolicy can only be Always", c.Name))
		}
	}
	sidecar := init && c.RestartPolicy != nil
	for what, p := range map[string]*corev1.Probe{"readinessProbe": c.ReadinessProbe, "livenessProbe": c.LivenessProbe, "startupProbe": c.StartupProbe} {
		if p == nil {
			continue
		}
		if init && !sidecar {
			errs = append(errs, fmt.Errorf("container %s: %s on an init container that is not a sidecar", c.Name, what))
		}
		if err := checkHandler(c, &p.ProbeHandler, what); err != nil {
			errs = append(errs, err)
		}
	}
	if c.Lifecycle != nil && c.Lifecycle.PreStop != nil {
		h := c.Lifecycle.PreStop
		n := 0
		for _, set := range []bool{h.Exec != nil, h.HTTPGet != nil, h.TCPSocket != nil, h.Sleep != nil} {
			if set {
				n++
			}
		}
		if n != 1 {
			errs = append(errs, fmt.Errorf("container %s: preStop must have exactly one action, has %d", c.Name, n))
		}
		if h.Sleep != nil && h.Sleep.Seconds <= 0 {
			errs = append(errs, fmt.Errorf("container %s: preStop sleep must be positive", c.Name))
		}
	}
	return errs
}

func checkPod(spec *corev1.PodSpec) []error {
	var errs []error
	names := map[string]bool{}
	for i := range spec.InitContainers {
		c := &spec.InitContainers[i]
		if names[c.Name] {
			errs = append(errs, fmt.Errorf("container name %s used twice", c.Name))
		}
		names[c.Name] = true
		errs = append(errs, checkContainer(c, true)...)
	}
	for i := range spec.Containers {
		c := &spec.Containers[i]
		if names[c.Name] {
			errs = append(errs, fmt.Errorf("container name %s used twice", c.Name))
		}
		names[c.Name] = true
		errs = append(errs, checkContainer(c, false)...)
	}
	if len(spec.Containers) == 0 {
		errs = append(errs, errors.New("a pod needs at least one container"))
	}
	volumes := map[string]bool{}
	for _, v := range spec.Volumes {
		volumes[v.Name] = true
	}
	for _, list := range [][]corev1.Container{spec.InitContainers, spec.Containers} {
		for _, c := range list {
			for _, m := range c.VolumeMounts {
				if !volumes[m.Name] {
					errs = append(errs, fmt.Errorf("container %s mounts volume %s, which the pod does not have", c.Name, m.Name))
				}
			}
		}
	}
	return errs
}

func checkDocument(doc []byte) (string, []error) {
	var h header
	if err := yaml.Unmarshal(doc, &h); err != nil {
		return "?", []error{err}
	}
	id := h.Kind + "/" + h.Metadata.Name
	obj, err := newObject(h.APIVersion, h.Kind)
	if err != nil {
		return id, []error{err}
	}
	if err := yaml.UnmarshalStrict(doc, obj); err != nil {
		return id, []error{err}
	}
	if h.Metadata.Name == "" {
		return id, []error{errors.New("metadata.name is empty")}
	}
	if spec := podSpecOf(obj); spec != nil {
		return id, checkPod(spec)
	}
	return id, nil
}

func checkFile(path string) (int, int) {
	data, err := os.ReadFile(path)
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", path, err)
		return 0, 1
	}
	reader := yamlutil.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	docs, failed := 0, 0
	for {
		doc, err := reader.Read()
		if err == io.EOF {
			break
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", path, err)
			return docs, failed + 1
		}
		if len(bytes.TrimSpace(stripComments(doc))) == 0 {
			continue
		}
		docs++
		id, errs := checkDocument(doc)
		for _, e := range errs {
			fmt.Fprintf(os.Stderr, "%s: %s: %v\n", path, id, e)
		}
		if len(errs) > 0 {
			failed++
		}
	}
	return docs, failed
}

func stripComments(doc []byte) []byte {
	var out []string
	for _, line := range strings.Split(string(doc), "\n") {
		if t := strings.TrimSpace(line); t == "" || strings.HasPrefix(t, "#") || t == "---" {
			continue
		}
		out = append(out, line)
	}
	return []byte(strings.Join(out, "\n"))
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: sluice-kubecheck FILE.yaml...")
		os.Exit(2)
	}
	total, failed := 0, 0
	for _, path := range os.Args[1:] {
		d, f := checkFile(path)
		total += d
		failed += f
	}
	fmt.Printf("%d documents checked, %d failed\n", total, failed)
	if failed > 0 || total == 0 {
		os.Exit(1)
	}
}
