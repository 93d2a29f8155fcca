package validate

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

const (
	chartDir    = "../idemproxy"
	releaseName = "idem"
	namespace   = "idem-test"
)

// helmBinary returns $HELM, else helm from PATH. A missing helm fails the test: it is a set-up
// step (charts/validate/install-helm.sh), never a reason to skip.
func helmBinary(t *testing.T) string {
	t.Helper()
	if h := os.Getenv("HELM"); h != "" {
		return h
	}
	h, err := exec.LookPath("helm")
	if err != nil {
		t.Fatalf("helm not found on PATH and $HELM is not set: run charts/validate/install-helm.sh "+
			"and put its output in $HELM (%v)", err)
	}
	return h
}

// render runs `helm template` on the chart with extra arguments (-f file, --set k=v) and
// returns stdout, or an error holding stderr when helm fails.
func render(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(helmBinary(t), append([]string{"template", releaseName, chartDir, "--namespace", namespace}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("helm template %s: %w: %s", strings.Join(args, " "), err, stderr.String())
	}
	return stdout.String(), nil
}

// valuesCase is one way of rendering the chart: the default values or a ci/*-values.yaml.
type valuesCase struct {
	name string
	args []string
}

// valuesCases lists the default values and every ci/*-values.yaml, so a new CI values file
// is validated without touching the tests.
func valuesCases(t *testing.T) []valuesCase {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(chartDir, "ci", "*-values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 3 {
		t.Fatalf("found %d ci/*-values.yaml files, want at least 3 (replicated, sentinel, routes)", len(files))
	}
	sort.Strings(files)
	cases := []valuesCase{{name: "default"}}
	for _, f := range files {
		cases = append(cases, valuesCase{name: filepath.Base(f), args: []string{"-f", f}})
	}
	return cases
}

// manifests is a rendered chart, decoded. Every object is also in all, keyed "Kind/name".
type manifests struct {
	all             map[string]any
	deployment      *appsv1.Deployment
	services        []*corev1.Service
	serviceAccounts []*corev1.ServiceAccount
	configMaps      []*corev1.ConfigMap
	secrets         []*corev1.Secret
	pods            []*corev1.Pod
	hpas            []*autoscalingv2.HorizontalPodAutoscaler
	pdbs            []*policyv1.PodDisruptionBudget
	ingresses       []*networkingv1.Ingress
	serviceMonitors []*serviceMonitor
	prometheusRules []*prometheusRule
}

// configMap returns the ConfigMap with that name, or nil.
func (m *manifests) configMap(name string) *corev1.ConfigMap {
	for _, cm := range m.configMaps {
		if cm.Name == name {
			return cm
		}
	}
	return nil
}

// secret returns the Secret with that name, or nil.
func (m *manifests) secret(name string) *corev1.Secret {
	for _, s := range m.secrets {
		if s.Name == name {
			return s
		}
	}
	return nil
}

// splitDocuments splits multi-document YAML and drops documents that hold only comments.
func splitDocuments(t *testing.T, out string) [][]byte {
	t.Helper()
	r := utilyaml.NewYAMLReader(bufio.NewReader(strings.NewReader(out)))
	var docs [][]byte
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return docs
		}
		if err != nil {
			t.Fatalf("split rendered YAML: %v", err)
		}
		var probe map[string]any
		if err := yaml.Unmarshal(doc, &probe); err != nil {
			t.Fatalf("rendered document is not YAML: %v\n%s", err, doc)
		}
		if len(probe) == 0 {
			continue
		}
		docs = append(docs, doc)
	}
}

// decodeStrict decodes one manifest into the typed object for its apiVersion and kind.
// Unknown fields (misspellings included: matching is case-sensitive), duplicate fields and
// wrong types are errors, as in the API server's strict field validation.
func decodeStrict(doc []byte) (any, metav1.TypeMeta, error) {
	var tm metav1.TypeMeta
	if err := yaml.Unmarshal(doc, &tm); err != nil {
		return nil, tm, fmt.Errorf("read apiVersion/kind: %w", err)
	}
	var obj any
	switch tm.APIVersion + "/" + tm.Kind {
	case "v1/ConfigMap":
		obj = &corev1.ConfigMap{}
	case "v1/Secret":
		obj = &corev1.Secret{}
	case "v1/Service":
		obj = &corev1.Service{}
	case "v1/ServiceAccount":
		obj = &corev1.ServiceAccount{}
	case "v1/Pod":
		obj = &corev1.Pod{}
	case "apps/v1/Deployment":
		obj = &appsv1.Deployment{}
	case "autoscaling/v2/HorizontalPodAutoscaler":
		obj = &autoscalingv2.HorizontalPodAutoscaler{}
	case "policy/v1/PodDisruptionBudget":
		obj = &policyv1.PodDisruptionBudget{}
	case "networking.k8s.io/v1/Ingress":
		obj = &networkingv1.Ingress{}
	case "monitoring.coreos.com/v1/ServiceMonitor":
		obj = &serviceMonitor{}
	case "monitoring.coreos.com/v1/PrometheusRule":
		obj = &prometheusRule{}
	default:
		return nil, tm, fmt.Errorf("no strict type for apiVersion %q kind %q: add it to decodeStrict", tm.APIVersion, tm.Kind)
	}
	data, err := yaml.YAMLToJSONStrict(doc)
	if err != nil {
		return nil, tm, fmt.Errorf("%s: %w", tm.Kind, err)
	}
	strictErrs, err := kjson.UnmarshalStrict(data, obj, kjson.DisallowDuplicateFields, kjson.DisallowUnknownFields)
	if err != nil {
		return nil, tm, fmt.Errorf("%s: %w", tm.Kind, err)
	}
	if len(strictErrs) > 0 {
		return nil, tm, fmt.Errorf("%s: strict decoding: %w", tm.Kind, errors.Join(strictErrs...))
	}
	return obj, tm, nil
}

// decodeAll decodes every document of a render strictly and sorts the objects by type.
func decodeAll(t *testing.T, out string) *manifests {
	t.Helper()
	m := &manifests{all: map[string]any{}}
	for _, doc := range splitDocuments(t, out) {
		obj, tm, err := decodeStrict(doc)
		if err != nil {
			t.Errorf("%v\n--- document:\n%s", err, doc)
			continue
		}
		var name string
		switch o := obj.(type) {
		case *corev1.ConfigMap:
			m.configMaps, name = append(m.configMaps, o), o.Name
		case *corev1.Secret:
			m.secrets, name = append(m.secrets, o), o.Name
		case *corev1.Service:
			m.services, name = append(m.services, o), o.Name
		case *corev1.ServiceAccount:
			m.serviceAccounts, name = append(m.serviceAccounts, o), o.Name
		case *corev1.Pod:
			m.pods, name = append(m.pods, o), o.Name
		case *appsv1.Deployment:
			if m.deployment != nil {
				t.Errorf("two Deployments: %s and %s", m.deployment.Name, o.Name)
			}
			m.deployment, name = o, o.Name
		case *autoscalingv2.HorizontalPodAutoscaler:
			m.hpas, name = append(m.hpas, o), o.Name
		case *policyv1.PodDisruptionBudget:
			m.pdbs, name = append(m.pdbs, o), o.Name
		case *networkingv1.Ingress:
			m.ingresses, name = append(m.ingresses, o), o.Name
		case *serviceMonitor:
			m.serviceMonitors, name = append(m.serviceMonitors, o), o.Name
		case *prometheusRule:
			m.prometheusRules, name = append(m.prometheusRules, o), o.Name
		}
		id := tm.Kind + "/" + name
		if _, dup := m.all[id]; dup {
			t.Errorf("%s rendered twice", id)
		}
		m.all[id] = obj
	}
	if m.deployment == nil {
		t.Fatal("no Deployment rendered")
	}
	return m
}

// mustRender renders and decodes strictly, failing the test on any error.
func mustRender(t *testing.T, args ...string) *manifests {
	t.Helper()
	out, err := render(t, args...)
	if err != nil {
		t.Fatal(err)
	}
	return decodeAll(t, out)
}
