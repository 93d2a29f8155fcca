package validate

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// serviceMonitor is the subset of the Prometheus Operator's monitoring.coreos.com/v1
// ServiceMonitor that the chart renders, written out by hand (field names and JSON tags as in
// prometheus-operator pkg/apis/monitoring/v1/servicemonitor_types.go) rather than importing
// the operator's module. Decoded strictly, so a field the chart renders but this struct lacks
// fails the test: extend it from the operator's types when the template grows.
type serviceMonitor struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              serviceMonitorSpec `json:"spec"`
}

type serviceMonitorSpec struct {
	JobLabel          string               `json:"jobLabel,omitempty"`
	TargetLabels      []string             `json:"targetLabels,omitempty"`
	PodTargetLabels   []string             `json:"podTargetLabels,omitempty"`
	Endpoints         []smEndpoint         `json:"endpoints"`
	Selector          metav1.LabelSelector `json:"selector"`
	NamespaceSelector smNamespaceSelector  `json:"namespaceSelector,omitempty"`
	SampleLimit       *uint64              `json:"sampleLimit,omitempty"`
}

type smNamespaceSelector struct {
	Any        bool     `json:"any,omitempty"`
	MatchNames []string `json:"matchNames,omitempty"`
}

type smEndpoint struct {
	Port              string              `json:"port,omitempty"`
	TargetPort        *string             `json:"targetPort,omitempty"`
	Path              string              `json:"path,omitempty"`
	Scheme            string              `json:"scheme,omitempty"`
	Params            map[string][]string `json:"params,omitempty"`
	Interval          string              `json:"interval,omitempty"`
	ScrapeTimeout     string              `json:"scrapeTimeout,omitempty"`
	HonorLabels       bool                `json:"honorLabels,omitempty"`
	HonorTimestamps   *bool               `json:"honorTimestamps,omitempty"`
	MetricRelabelings []smRelabelConfig   `json:"metricRelabelings,omitempty"`
	Relabelings       []smRelabelConfig   `json:"relabelings,omitempty"`
}

type smRelabelConfig struct {
	SourceLabels []string `json:"sourceLabels,omitempty"`
	Separator    *string  `json:"separator,omitempty"`
	TargetLabel  string   `json:"targetLabel,omitempty"`
	Regex        string   `json:"regex,omitempty"`
	Modulus      uint64   `json:"modulus,omitempty"`
	Replacement  *string  `json:"replacement,omitempty"`
	Action       string   `json:"action,omitempty"`
}
