package charts

import (
	"slices"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// HTTPRoute is the part of gateway.networking.k8s.io/v1 HTTPRoute the chart
// writes, decoded as strictly as the Kubernetes types.
type HTTPRoute struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              HTTPRouteSpec `json:"spec"`
}

type HTTPRouteSpec struct {
	ParentRefs []ParentRef  `json:"parentRefs"`
	Hostnames  []string     `json:"hostnames,omitempty"`
	Rules      []HTTPRouteR `json:"rules"`
}

type ParentRef struct {
	Group       string `json:"group,omitempty"`
	Kind        string `json:"kind,omitempty"`
	Namespace   string `json:"namespace,omitempty"`
	Name        string `json:"name"`
	SectionName string `json:"sectionName,omitempty"`
	Port        int32  `json:"port,omitempty"`
}

type HTTPRouteR struct {
	Matches     []HTTPRouteMatch `json:"matches"`
	BackendRefs []BackendRef     `json:"backendRefs"`
}

type HTTPRouteMatch struct {
	Path struct {
		Type  string `json:"type"`
		Value string `json:"value"`
	} `json:"path"`
}

type BackendRef struct {
	Name string `json:"name"`
	Port int32  `json:"port"`
}

// Neither an Ingress, an HTTPRoute nor a NetworkPolicy unless asked for;
// asked for, the first two route the push endpoints, and only them, to the
// ingest Service.
func TestIngressAndHTTPRouteExposeOnlyThePushEndpoints(t *testing.T) {
	t.Parallel()
	for _, k := range mustRender(t, withExampleRoutes(t)).kinds() {
		for _, not := range []string{"Ingress/", "HTTPRoute/", "NetworkPolicy/"} {
			if len(k) >= len(not) && k[:len(not)] == not {
				t.Errorf("%s rendered by default", k)
			}
		}
	}
	r := mustRender(t, withExampleRoutes(t, `
ingress:
  enabled: true
  className: nginx
  annotations: {cert-manager.io/cluster-issuer: letsencrypt}
  hosts: [push.example.com, push.example.org]
  tls: [{secretName: push-tls, hosts: [push.example.com, push.example.org]}]
httpRoute:
  enabled: true
  parentRefs: [{name: public, namespace: gateways, sectionName: https}]
  hostnames: [push.example.com]
`))
	ingestSvc := get[corev1.Service](t, r, fullname)
	ing := get[networkingv1.Ingress](t, r, fullname)
	if ing.Spec.IngressClassName == nil || *ing.Spec.IngressClassName != "nginx" || len(ing.Spec.TLS) != 1 ||
		ing.Annotations["cert-manager.io/cluster-issuer"] != "letsencrypt" || len(ing.Spec.Rules) != 2 {
		t.Fatalf("ingress %+v", ing.Spec)
	}
	for i, rule := range ing.Spec.Rules {
		if rule.Host != []string{"push.example.com", "push.example.org"}[i] || len(rule.HTTP.Paths) != 1 {
			t.Fatalf("rule %d: %+v", i, rule)
		}
		p := rule.HTTP.Paths[0]
		if p.Path != "/v1/push/" || *p.PathType != networkingv1.PathTypePrefix || p.Backend.Service.Name != ingestSvc.Name ||
			p.Backend.Service.Port.Name != ingestSvc.Spec.Ports[0].Name {
			t.Errorf("rule %d routes %s to %+v, want /v1/push/ to the ingest Service", i, p.Path, p.Backend.Service)
		}
	}
	hr := get[HTTPRoute](t, r, fullname)
	if len(hr.Spec.ParentRefs) != 1 || hr.Spec.ParentRefs[0] != (ParentRef{Name: "public", Namespace: "gateways", SectionName: "https"}) ||
		!slices.Equal(hr.Spec.Hostnames, []string{"push.example.com"}) || len(hr.Spec.Rules) != 1 {
		t.Fatalf("HTTPRoute %+v", hr.Spec)
	}
	rule := hr.Spec.Rules[0]
	if len(rule.Matches) != 1 || rule.Matches[0].Path.Type != "PathPrefix" || rule.Matches[0].Path.Value != "/v1/push/" ||
		len(rule.BackendRefs) != 1 || rule.BackendRefs[0].Name != ingestSvc.Name || rule.BackendRefs[0].Port != ingestSvc.Spec.Ports[0].Port {
		t.Errorf("HTTPRoute rule %+v, want /v1/push/ to the ingest Service", rule)
	}
}

// The NetworkPolicy selects the gateway pods, opens the ingest port to the
// peers listed (or anyone), the admin port to its own peers only, and
// governs egress only when egress rules are given.
func TestNetworkPolicy(t *testing.T) {
	t.Parallel()
	r := mustRender(t, withExampleRoutes(t, `
networkPolicy:
  enabled: true
  adminFrom: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: monitoring}}}]
`))
	np := get[networkingv1.NetworkPolicy](t, r, fullname)
	pods := get[appsv1.Deployment](t, r, fullname).Spec.Template.Labels
	sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
	if err != nil || !sel.Matches(labels.Set(pods)) {
		t.Fatalf("the policy's selector %v does not select the gateway pods %v", np.Spec.PodSelector, pods)
	}
	if migrate := get[batchv1.Job](t, r, fullname+"-migrate").Spec.Template.Labels; sel.Matches(labels.Set(migrate)) {
		t.Errorf("the policy also selects the migration job's pods %v", migrate)
	}
	if !slices.Equal(np.Spec.PolicyTypes, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}) || len(np.Spec.Egress) != 0 {
		t.Errorf("policy types %v, egress %v: want Ingress only", np.Spec.PolicyTypes, np.Spec.Egress)
	}
	if len(np.Spec.Ingress) != 2 {
		t.Fatalf("ingress rules %+v", np.Spec.Ingress)
	}
	ingest, admin := np.Spec.Ingress[0], np.Spec.Ingress[1]
	if len(ingest.Ports) != 1 || *ingest.Ports[0].Port != intstr.FromString("ingest") || len(ingest.From) != 0 {
		t.Errorf("ingest rule %+v, want the ingest port from anywhere", ingest)
	}
	if len(admin.Ports) != 1 || *admin.Ports[0].Port != intstr.FromString("admin") || len(admin.From) != 1 ||
		admin.From[0].NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"] != "monitoring" {
		t.Errorf("admin rule %+v, want the admin port from monitoring only", admin)
	}
	// Ports named in the policy are the container's.
	c := gatewayContainer(t, r)
	for _, p := range []intstr.IntOrString{intstr.FromString("ingest"), intstr.FromString("admin")} {
		containerPort(t, c, p)
	}

	// Without adminFrom nothing reaches the admin port; with egress rules
	// the policy governs egress too.
	r = mustRender(t, withExampleRoutes(t, `
networkPolicy:
  enabled: true
  ingestFrom: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: ingress-nginx}}}]
  egress: [{to: [{ipBlock: {cidr: 10.0.0.0/8}}]}]
`))
	np = get[networkingv1.NetworkPolicy](t, r, fullname)
	if len(np.Spec.Ingress) != 1 || len(np.Spec.Ingress[0].From) != 1 {
		t.Errorf("ingress rules %+v, want only the ingest port, from ingress-nginx", np.Spec.Ingress)
	}
	if !slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeEgress) || len(np.Spec.Egress) != 1 {
		t.Errorf("policy types %v, egress %v", np.Spec.PolicyTypes, np.Spec.Egress)
	}
}
