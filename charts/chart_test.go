// Package charts holds no code. It exists for its tests: they render the Helm
// chart in charts/ackgate with the Helm Go SDK, run Helm's lint on it and
// decode every rendered manifest strictly into the Kubernetes API types, so
// that `go test ./...` catches a broken chart without a cluster or a helm
// binary. dockerfile_test.go holds the repository's Dockerfile and
// .dockerignore to account as far as a machine without a container engine
// can.
package charts

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	stdjson "encoding/json"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"
	"helm.sh/helm/v3/pkg/release"
	"helm.sh/helm/v3/pkg/releaseutil"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"

	"github.com/ackgate/ackgate/config"
)

const (
	chartDir    = "ackgate"
	releaseName = "gw"
	namespace   = "payments"
	fullname    = "gw-ackgate"
	examples    = "../examples/routes.yaml"
)

// Secret settings of the minimal installation. No manifest other than the
// chart's own Secret may contain any of them, plain or base64-encoded.
const (
	databaseURL = "postgres://ackgate:pg-pw-4c1f@pg.internal:5432/ackgate?sslmode=require&pool_max_conns=8"
	redisURL    = "redis://:redis-pw-91ab@redis.internal:6379/0"
	adminToken  = "admin-token-6f0e2d7c9b8a"
	sentinelPW  = "sentinel-pw-33de"
)

// minimal is what an installation cannot do without; the routes come from
// examples/routes.yaml (see withExampleRoutes).
const minimal = `
image:
  repository: registry.example.com/platform/ackgate
database:
  url: "` + databaseURL + `"
redis:
  url: "` + redisURL + `"
adminToken:
  value: ` + adminToken + `
`

// ServiceMonitor is the part of monitoring.coreos.com/v1 ServiceMonitor the
// chart writes, with the field names of the Prometheus Operator's API. It is
// local so the tests need not import the operator; decoding is as strict as
// for the Kubernetes types, so a field the chart writes and this struct (or
// the CRD) lacks fails the test.
type ServiceMonitor struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              ServiceMonitorSpec `json:"spec"`
}

type ServiceMonitorSpec struct {
	JobLabel          string               `json:"jobLabel,omitempty"`
	Selector          metav1.LabelSelector `json:"selector"`
	NamespaceSelector NamespaceSelector    `json:"namespaceSelector,omitempty"`
	Endpoints         []Endpoint           `json:"endpoints"`
}

type NamespaceSelector struct {
	Any        bool     `json:"any,omitempty"`
	MatchNames []string `json:"matchNames,omitempty"`
}

type Endpoint struct {
	Port          string             `json:"port,omitempty"`
	Path          string             `json:"path,omitempty"`
	Scheme        string             `json:"scheme,omitempty"`
	Interval      string             `json:"interval,omitempty"`
	ScrapeTimeout string             `json:"scrapeTimeout,omitempty"`
	Authorization *SafeAuthorization `json:"authorization,omitempty"`
	HonorLabels   bool               `json:"honorLabels,omitempty"`
}

type SafeAuthorization struct {
	Type        string                    `json:"type,omitempty"`
	Credentials *corev1.SecretKeySelector `json:"credentials,omitempty"`
}

// kinds are the API types a rendered manifest may have; anything else fails.
var kinds = map[string]func() any{
	"v1/ConfigMap":                            func() any { return &corev1.ConfigMap{} },
	"v1/Secret":                               func() any { return &corev1.Secret{} },
	"v1/Service":                              func() any { return &corev1.Service{} },
	"v1/ServiceAccount":                       func() any { return &corev1.ServiceAccount{} },
	"apps/v1/Deployment":                      func() any { return &appsv1.Deployment{} },
	"batch/v1/Job":                            func() any { return &batchv1.Job{} },
	"autoscaling/v2/HorizontalPodAutoscaler":  func() any { return &autoscalingv2.HorizontalPodAutoscaler{} },
	"policy/v1/PodDisruptionBudget":           func() any { return &policyv1.PodDisruptionBudget{} },
	"monitoring.coreos.com/v1/ServiceMonitor": func() any { return &ServiceMonitor{} },
	"monitoring.coreos.com/v1/PrometheusRule": func() any { return &PrometheusRule{} },
	"networking.k8s.io/v1/NetworkPolicy":      func() any { return &networkingv1.NetworkPolicy{} },
	"networking.k8s.io/v1/Ingress":            func() any { return &networkingv1.Ingress{} },
	"gateway.networking.k8s.io/v1/HTTPRoute":  func() any { return &HTTPRoute{} },
}

// decodeStrict turns one YAML manifest into its API type. Duplicate keys,
// unknown fields and fields in the wrong case are errors, as they are for an
// API server with strict field validation.
func decodeStrict(doc []byte) (string, any, error) {
	j, err := yaml.YAMLToJSONStrict(doc)
	if err != nil {
		return "", nil, err
	}
	var tm metav1.TypeMeta
	if err := stdjson.Unmarshal(j, &tm); err != nil {
		return "", nil, err
	}
	kind := tm.APIVersion + "/" + tm.Kind
	newObj, ok := kinds[kind]
	if !ok {
		return kind, nil, fmt.Errorf("%s is not a kind the chart should render", kind)
	}
	obj := newObj()
	strict, err := kjson.UnmarshalStrict(j, obj)
	if err != nil {
		return kind, nil, err
	}
	if len(strict) > 0 {
		return kind, nil, errors.Join(strict...)
	}
	return kind, obj, nil
}

// object is one rendered manifest.
type object struct {
	source string // template file
	kind   string // apiVersion/Kind
	text   string // as rendered
	obj    any
	meta   metav1.Object
}

type rendered struct {
	files   map[string]string
	objects []object
	notes   string
}

// values merges YAML documents (later ones win), read the way `helm -f` reads
// a values file.
func values(t *testing.T, docs ...string) map[string]any {
	t.Helper()
	acc := map[string]any{}
	for _, d := range docs {
		v, err := chartutil.ReadValues([]byte(d))
		if err != nil {
			t.Fatalf("values %q: %v", d, err)
		}
		acc = chartutil.CoalesceTables(v.AsMap(), acc)
	}
	return acc
}

func exampleRoutes(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(examples)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// withExampleRoutes is the minimal installation with the example routes plus
// the given overrides.
func withExampleRoutes(t *testing.T, overrides ...string) map[string]any {
	return values(t, append([]string{minimal, exampleRoutes(t)}, overrides...)...)
}

// render renders the chart as `helm install gw -n payments` would (schema
// validation included) with the engine in strict mode, so a template that
// reads a value missing from values.yaml fails as well.
func render(t *testing.T, vals map[string]any) (*rendered, error) {
	t.Helper()
	ch, err := loader.Load(chartDir)
	if err != nil {
		t.Fatalf("load chart: %v", err)
	}
	rv, err := chartutil.ToRenderValues(ch, vals, chartutil.ReleaseOptions{
		Name: releaseName, Namespace: namespace, Revision: 1, IsInstall: true,
	}, chartutil.DefaultCapabilities)
	if err != nil {
		return nil, err
	}
	files, err := engine.Engine{Strict: true}.Render(ch, rv)
	if err != nil {
		return nil, err
	}
	r := &rendered{files: map[string]string{}}
	names := slices.Sorted(func(yield func(string) bool) {
		for k := range files {
			if !yield(k) {
				return
			}
		}
	})
	for _, name := range names {
		text := files[name]
		switch {
		case strings.HasSuffix(name, "NOTES.txt"):
			r.notes = text
			continue
		case !strings.HasSuffix(name, ".yaml"):
			t.Fatalf("unexpected template output %s", name)
		}
		r.files[name] = text
		for _, doc := range releaseutil.SplitManifests(text) {
			if strings.TrimSpace(doc) == "" {
				continue
			}
			kind, obj, err := decodeStrict([]byte(doc))
			if err != nil {
				t.Fatalf("%s: %s does not decode strictly: %v\n%s", name, kind, err, doc)
			}
			m, err := meta.Accessor(obj)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			r.objects = append(r.objects, object{source: name, kind: kind, text: doc, obj: obj, meta: m})
		}
	}
	return r, nil
}

func mustRender(t *testing.T, vals map[string]any) *rendered {
	t.Helper()
	r, err := render(t, vals)
	if err != nil {
		t.Fatalf("render: %v", err)
	}
	checkObjects(t, r)
	return r
}

// checkObjects holds every object to what the API server would demand of its
// metadata: valid names and labels, the release namespace, unique names per
// kind.
func checkObjects(t *testing.T, r *rendered) {
	t.Helper()
	seen := map[string]bool{}
	for _, o := range r.objects {
		name := o.meta.GetName()
		var errs []string
		if o.kind == "v1/Service" {
			errs = validation.IsDNS1035Label(name)
		} else {
			errs = validation.IsDNS1123Subdomain(name)
		}
		if len(errs) > 0 {
			t.Errorf("%s %q: invalid name: %v", o.kind, name, errs)
		}
		if ns := o.meta.GetNamespace(); ns != namespace {
			t.Errorf("%s %q: namespace %q, want the release namespace %q", o.kind, name, ns, namespace)
		}
		checkLabels(t, o.kind+" "+name, o.meta.GetLabels())
		if seen[o.kind+"/"+name] {
			t.Errorf("%s %q rendered twice", o.kind, name)
		}
		seen[o.kind+"/"+name] = true
	}
}

func checkLabels(t *testing.T, what string, l map[string]string) {
	t.Helper()
	for k, v := range l {
		if errs := validation.IsQualifiedName(k); len(errs) > 0 {
			t.Errorf("%s: label key %q: %v", what, k, errs)
		}
		if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
			t.Errorf("%s: label %s=%q: %v", what, k, v, errs)
		}
	}
}

// get returns the one object of type T named name.
func get[T any](t *testing.T, r *rendered, name string) *T {
	t.Helper()
	var found *T
	for _, o := range r.objects {
		if v, ok := o.obj.(*T); ok && o.meta.GetName() == name {
			if found != nil {
				t.Fatalf("two %T named %q", v, name)
			}
			found = v
		}
	}
	if found == nil {
		t.Fatalf("no %T named %q among %v", found, name, r.kinds())
	}
	return found
}

func all[T any](r *rendered) []*T {
	var out []*T
	for _, o := range r.objects {
		if v, ok := o.obj.(*T); ok {
			out = append(out, v)
		}
	}
	return out
}

// kinds lists the rendered objects as "Kind/name", sorted.
func (r *rendered) kinds() []string {
	var out []string
	for _, o := range r.objects {
		out = append(out, o.kind[strings.LastIndex(o.kind, "/")+1:]+"/"+o.meta.GetName())
	}
	sort.Strings(out)
	return out
}

func container(t *testing.T, spec corev1.PodSpec, name string) corev1.Container {
	t.Helper()
	for _, c := range spec.Containers {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no container %q", name)
	return corev1.Container{}
}

func gatewayContainer(t *testing.T, r *rendered) corev1.Container {
	return container(t, get[appsv1.Deployment](t, r, fullname).Spec.Template.Spec, "gateway")
}

// envSource describes where each variable comes from: "value:..." ,
// "secret:name/key" or "field:path".
func envSource(t *testing.T, c corev1.Container) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, e := range c.Env {
		if _, dup := out[e.Name]; dup {
			t.Errorf("container %s: %s set twice", c.Name, e.Name)
		}
		switch {
		case e.ValueFrom == nil:
			out[e.Name] = "value:" + e.Value
		case e.ValueFrom.SecretKeyRef != nil:
			out[e.Name] = "secret:" + e.ValueFrom.SecretKeyRef.Name + "/" + e.ValueFrom.SecretKeyRef.Key
		case e.ValueFrom.FieldRef != nil:
			out[e.Name] = "field:" + e.ValueFrom.FieldRef.FieldPath
		case e.ValueFrom.ResourceFieldRef != nil:
			out[e.Name] = "resource:" + e.ValueFrom.ResourceFieldRef.ContainerName + "/" + e.ValueFrom.ResourceFieldRef.Resource
		default:
			t.Errorf("container %s: %s has an unexpected source %+v", c.Name, e.Name, e.ValueFrom)
		}
	}
	return out
}

// resolveEnv is the environment the kubelet would give the container, with
// secretKeyRefs looked up in the rendered Secrets and in existing.
func resolveEnv(t *testing.T, r *rendered, c corev1.Container, existing map[string]map[string]string) map[string]string {
	t.Helper()
	secrets := map[string]map[string]string{}
	for name, data := range existing {
		secrets[name] = data
	}
	for _, s := range all[corev1.Secret](r) {
		data := map[string]string{}
		for k, v := range s.Data {
			data[k] = string(v)
		}
		secrets[s.Name] = data
	}
	env := map[string]string{}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			env[e.Name] = e.Value
		case e.ValueFrom.SecretKeyRef != nil:
			ref := e.ValueFrom.SecretKeyRef
			v, ok := secrets[ref.Name][ref.Key]
			if !ok {
				t.Fatalf("%s: Secret %s has no key %s", e.Name, ref.Name, ref.Key)
			}
			env[e.Name] = v
		case e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.name":
			env[e.Name] = fullname + "-6d4cf56db6-x7k2p"
		case e.ValueFrom.ResourceFieldRef != nil && e.ValueFrom.ResourceFieldRef.Resource == "limits.memory" &&
			e.ValueFrom.ResourceFieldRef.ContainerName == c.Name && e.ValueFrom.ResourceFieldRef.Divisor.IsZero():
			// The kubelet writes the limit in bytes (divisor 1).
			env[e.Name] = strconv.FormatInt(c.Resources.Limits.Memory().Value(), 10)
		default:
			t.Fatalf("%s: cannot resolve %+v", e.Name, e.ValueFrom)
		}
	}
	return env
}

// routesFile is the routes file the gateway pods read, from the ConfigMap the
// Deployment mounts at the directory GATEWAY_ROUTES_FILE names.
func routesFile(t *testing.T, r *rendered) string {
	t.Helper()
	d := get[appsv1.Deployment](t, r, fullname)
	c := gatewayContainer(t, r)
	file := envSource(t, c)["GATEWAY_ROUTES_FILE"]
	file, ok := strings.CutPrefix(file, "value:")
	if !ok {
		t.Fatalf("GATEWAY_ROUTES_FILE is %q, want a plain value", file)
	}
	for _, m := range c.VolumeMounts {
		if m.MountPath != path.Dir(file) {
			continue
		}
		if !m.ReadOnly {
			t.Errorf("routes mount %s is writable", m.MountPath)
		}
		for _, v := range d.Spec.Template.Spec.Volumes {
			if v.Name == m.Name && v.ConfigMap != nil {
				cm := get[corev1.ConfigMap](t, r, v.ConfigMap.Name)
				data, ok := cm.Data[path.Base(file)]
				if !ok {
					t.Fatalf("ConfigMap %s has no key %s", cm.Name, path.Base(file))
				}
				return data
			}
		}
	}
	t.Fatalf("nothing mounted from a ConfigMap at %s", path.Dir(file))
	return ""
}

func containerPort(t *testing.T, c corev1.Container, p intstr.IntOrString) int32 {
	t.Helper()
	if p.Type == intstr.Int {
		return p.IntVal
	}
	for _, cp := range c.Ports {
		if cp.Name == p.StrVal {
			return cp.ContainerPort
		}
	}
	t.Fatalf("container %s has no port named %q", c.Name, p.StrVal)
	return 0
}

func hookWeight(t *testing.T, r *rendered) map[string]*release.Hook {
	t.Helper()
	hooks, _, err := releaseutil.SortManifests(r.files, nil, releaseutil.InstallOrder)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*release.Hook{}
	for _, h := range hooks {
		out[h.Kind+"/"+h.Name] = h
	}
	return out
}

// TestLint runs Helm's own linter (the code behind `helm lint`) with several
// value sets, including none at all: `helm lint charts/ackgate` must pass as
// it stands (lint mode turns the chart's required-value failures into notes).
// An error or a warning fails. The last case proves lint validates values
// against the schema, so a clean result means something.
func TestLint(t *testing.T) {
	t.Parallel()
	cases := map[string]map[string]any{
		"chart defaults only": {},
		"minimal":             withExampleRoutes(t),
		"sentinel":            withExampleRoutes(t, sentinelValues),
		"cluster":             withExampleRoutes(t, clusterValues),
		"everything on": withExampleRoutes(t, `
autoscaling: {enabled: true, targetMemoryUtilizationPercentage: 80}
serviceMonitor: {enabled: true, labels: {release: prometheus}}
podDisruptionBudget: {maxUnavailable: "50%"}
extraEnv: [{name: OTEL_SERVICE_NAME, value: ackgate}]
`),
	}
	for name, vals := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			l := lint.AllWithKubeVersion(chartDir, vals, namespace, nil)
			for _, m := range l.Messages {
				if m.Severity >= support.WarningSev {
					t.Errorf("lint: %s", m)
				}
			}
		})
	}
	t.Run("invalid values", func(t *testing.T) {
		t.Parallel()
		l := lint.AllWithKubeVersion(chartDir, withExampleRoutes(t, "replicaCount: two"), namespace, nil)
		var errs []string
		for _, m := range l.Messages {
			if m.Severity == support.ErrorSev {
				errs = append(errs, m.Err.Error())
			}
		}
		if !strings.Contains(strings.Join(errs, "\n"), "replicaCount") {
			t.Errorf("lint of replicaCount: two reported %q, want a schema error", errs)
		}
	})
}

func TestDefaultsRenderTheExpectedObjects(t *testing.T) {
	t.Parallel()
	r := mustRender(t, withExampleRoutes(t))
	want := []string{
		"ConfigMap/gw-ackgate-routes",
		"Deployment/gw-ackgate",
		"Job/gw-ackgate-migrate",
		"PodDisruptionBudget/gw-ackgate",
		"Secret/gw-ackgate",
		"Service/gw-ackgate",
		"Service/gw-ackgate-admin",
		"ServiceAccount/gw-ackgate",
	}
	if got := r.kinds(); !slices.Equal(got, want) {
		t.Errorf("objects:\n got %v\nwant %v", got, want)
	}
}

func TestDeployment(t *testing.T) {
	t.Parallel()
	r := mustRender(t, withExampleRoutes(t))
	d := get[appsv1.Deployment](t, r, fullname)
	pod := d.Spec.Template.Spec
	c := gatewayContainer(t, r)

	if d.Spec.Replicas == nil || *d.Spec.Replicas != 2 {
		t.Errorf("replicas = %v, want 2", d.Spec.Replicas)
	}
	sel, err := metav1.LabelSelectorAsSelector(d.Spec.Selector)
	if err != nil || !sel.Matches(labels.Set(d.Spec.Template.Labels)) {
		t.Errorf("selector %v does not select the pod template's labels %v (%v)", d.Spec.Selector, d.Spec.Template.Labels, err)
	}
	if ru := d.Spec.Strategy.RollingUpdate; ru == nil || ru.MaxUnavailable == nil || ru.MaxUnavailable.IntValue() != 0 {
		t.Errorf("rolling update %+v: want maxUnavailable 0 so a bad release never removes serving pods", ru)
	}
	if want := "registry.example.com/platform/ackgate:0.1.0"; c.Image != want {
		t.Errorf("image %q, want %q (appVersion as the default tag)", c.Image, want)
	}
	if !slices.Equal(c.Args, []string{"serve"}) || len(c.Command) != 0 {
		t.Errorf("command %v args %v, want the image's entrypoint with args [serve]", c.Command, c.Args)
	}

	// Probes: GET /healthz and /readyz on the ingest listener, port 8080.
	for _, p := range []struct {
		name  string
		probe *corev1.Probe
		path  string
	}{{"liveness", c.LivenessProbe, "/healthz"}, {"readiness", c.ReadinessProbe, "/readyz"}} {
		if p.probe == nil || p.probe.HTTPGet == nil {
			t.Errorf("%s probe: not an HTTP GET: %+v", p.name, p.probe)
			continue
		}
		if p.probe.HTTPGet.Path != p.path {
			t.Errorf("%s probe path %q, want %q", p.name, p.probe.HTTPGet.Path, p.path)
		}
		if port := containerPort(t, c, p.probe.HTTPGet.Port); port != 8080 {
			t.Errorf("%s probe port %d, want the ingest port 8080", p.name, port)
		}
	}
	env := envSource(t, c)
	if env["GATEWAY_LISTEN_ADDR"] != "value::8080" || env["GATEWAY_ADMIN_ADDR"] != "value::8081" {
		t.Errorf("listeners %q and %q, want :8080 and :8081", env["GATEWAY_LISTEN_ADDR"], env["GATEWAY_ADMIN_ADDR"])
	}

	// Hardening.
	psc := pod.SecurityContext
	if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.RunAsUser == nil || *psc.RunAsUser == 0 ||
		psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("pod securityContext %+v: want non-root, a non-zero uid and RuntimeDefault seccomp", psc)
	}
	checkContainerHardened(t, c)
	if pod.AutomountServiceAccountToken == nil || *pod.AutomountServiceAccountToken {
		t.Error("the service account token is mounted; the gateway never calls the API")
	}
	if c.Resources.Requests.Cpu().IsZero() || c.Resources.Limits.Memory().IsZero() {
		t.Errorf("resources %+v: want a CPU request (the HPA's base) and a memory limit", c.Resources)
	}

	// Shutdown: the kubelet must not kill the process while it drains.
	shutdown, err := time.ParseDuration(strings.TrimPrefix(env["GATEWAY_SHUTDOWN_TIMEOUT"], "value:"))
	if err != nil {
		t.Fatalf("GATEWAY_SHUTDOWN_TIMEOUT: %v", err)
	}
	var preStop time.Duration
	if c.Lifecycle != nil && c.Lifecycle.PreStop != nil && c.Lifecycle.PreStop.Sleep != nil {
		preStop = time.Duration(c.Lifecycle.PreStop.Sleep.Seconds) * time.Second
	}
	if preStop == 0 {
		t.Error("no preStop sleep: the listeners would close before endpoints stop routing to the pod")
	}
	grace := time.Duration(*pod.TerminationGracePeriodSeconds) * time.Second
	if grace <= preStop+shutdown {
		t.Errorf("terminationGracePeriodSeconds %s does not exceed preStop %s + GATEWAY_SHUTDOWN_TIMEOUT %s", grace, preStop, shutdown)
	}

	// Spread over nodes, softly.
	if len(pod.TopologySpreadConstraints) != 1 || pod.TopologySpreadConstraints[0].WhenUnsatisfiable != corev1.ScheduleAnyway {
		t.Errorf("topology spread %+v: want one soft constraint", pod.TopologySpreadConstraints)
	}
}

func checkContainerHardened(t *testing.T, c corev1.Container) {
	t.Helper()
	sc := c.SecurityContext
	if sc == nil {
		t.Fatalf("container %s has no securityContext", c.Name)
	}
	if sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot {
		t.Errorf("container %s: runAsNonRoot not set", c.Name)
	}
	if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		t.Errorf("container %s: root filesystem writable", c.Name)
	}
	if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Errorf("container %s: privilege escalation allowed", c.Name)
	}
	if sc.Privileged != nil && *sc.Privileged {
		t.Errorf("container %s: privileged", c.Name)
	}
	if sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) > 0 {
		t.Errorf("container %s: capabilities %+v, want drop [ALL] and no add", c.Name, sc.Capabilities)
	}
	if sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("container %s: seccomp %+v, want RuntimeDefault", c.Name, sc.SeccompProfile)
	}
}

// TestRenderedEnvironmentIsAValidGatewayConfiguration hands the environment
// and routes file the pods would get to the gateway's own loaders: what the
// chart renders is a configuration `gateway serve` accepts, per Redis mode.
func TestRenderedEnvironmentIsAValidGatewayConfiguration(t *testing.T) {
	t.Parallel()
	existing := map[string]map[string]string{
		"ledger-credentials": {"url": databaseURL},
		"redis-credentials":  {"url": redisURL, "sentinel": sentinelPW},
		"admin-credentials":  {"token": adminToken},
	}
	cases := []struct {
		name       string
		values     []string
		redisEnv   map[string]string // every GATEWAY_REDIS_* variable and its source
		master     string
		addrs      []string
		sentinelPW string
		cluster    bool
	}{
		{
			name:     "standalone",
			redisEnv: map[string]string{"GATEWAY_REDIS_URL": "secret:gw-ackgate/redis-url"},
			addrs:    []string{"redis.internal:6379"},
		},
		{
			name:   "sentinel",
			values: []string{sentinelValues},
			redisEnv: map[string]string{
				"GATEWAY_REDIS_URL":               "secret:gw-ackgate/redis-url",
				"GATEWAY_REDIS_ADDRS":             "value:sentinel-0.redis:26379,sentinel-1.redis:26379,sentinel-2.redis:26379",
				"GATEWAY_REDIS_MASTER_NAME":       "value:ledger-master",
				"GATEWAY_REDIS_SENTINEL_PASSWORD": "secret:gw-ackgate/redis-sentinel-password",
			},
			master:     "ledger-master",
			addrs:      []string{"sentinel-0.redis:26379", "sentinel-1.redis:26379", "sentinel-2.redis:26379"},
			sentinelPW: sentinelPW,
		},
		{
			name: "sentinel without URL, existing secret for the Sentinel password",
			values: []string{sentinelValues, `
redis:
  url: ""
  sentinel: {password: "", existingSecret: redis-credentials, existingSecretKey: sentinel}
`},
			redisEnv: map[string]string{
				"GATEWAY_REDIS_ADDRS":             "value:sentinel-0.redis:26379,sentinel-1.redis:26379,sentinel-2.redis:26379",
				"GATEWAY_REDIS_MASTER_NAME":       "value:ledger-master",
				"GATEWAY_REDIS_SENTINEL_PASSWORD": "secret:redis-credentials/sentinel",
			},
			master:     "ledger-master",
			addrs:      []string{"sentinel-0.redis:26379", "sentinel-1.redis:26379", "sentinel-2.redis:26379"},
			sentinelPW: sentinelPW,
		},
		{
			name:   "cluster",
			values: []string{clusterValues},
			redisEnv: map[string]string{
				"GATEWAY_REDIS_URL":     "secret:gw-ackgate/redis-url",
				"GATEWAY_REDIS_ADDRS":   "value:redis-cluster-0.redis:6379",
				"GATEWAY_REDIS_CLUSTER": "value:true",
			},
			addrs:   []string{"redis-cluster-0.redis:6379"},
			cluster: true,
		},
		{
			name:   "existing secrets",
			values: []string{existingSecretsValues},
			redisEnv: map[string]string{
				"GATEWAY_REDIS_URL": "secret:redis-credentials/url",
			},
			addrs: []string{"redis.internal:6379"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := mustRender(t, withExampleRoutes(t, tc.values...))
			c := gatewayContainer(t, r)
			src := envSource(t, c)
			gotRedis := map[string]string{}
			for k, v := range src {
				if strings.HasPrefix(k, "GATEWAY_REDIS_") {
					gotRedis[k] = v
				}
			}
			if fmt.Sprint(gotRedis) != fmt.Sprint(tc.redisEnv) {
				t.Errorf("Redis variables:\n got %v\nwant %v", gotRedis, tc.redisEnv)
			}
			for _, k := range []string{"GATEWAY_DATABASE_URL", "GATEWAY_ADMIN_TOKEN"} {
				if !strings.HasPrefix(src[k], "secret:") {
					t.Errorf("%s comes from %q, want a Secret reference", k, src[k])
				}
			}

			env := resolveEnv(t, r, c, existing)
			s, err := config.LoadSettings(func(k string) string { return env[k] })
			if err != nil {
				t.Fatalf("gateway settings: %v", err)
			}
			if err := s.ValidateServe(); err != nil {
				t.Errorf("serve would refuse: %v", err)
			}
			if s.DatabaseURL != databaseURL || s.AdminToken != adminToken {
				t.Errorf("database URL or admin token did not reach the gateway")
			}
			routes, err := config.ParseRoutes([]byte(routesFile(t, r)))
			if err != nil {
				t.Fatalf("routes file: %v", err)
			}
			if err := s.CheckRoutes(routes); err != nil {
				t.Errorf("settings against routes: %v", err)
			}
			o, err := s.RedisOptions()
			if err != nil {
				t.Fatal(err)
			}
			if o.MasterName != tc.master || !slices.Equal(o.Addrs, tc.addrs) || o.SentinelPassword != tc.sentinelPW || o.IsClusterMode != tc.cluster {
				t.Errorf("Redis options: master %q addrs %v sentinel password set %v cluster %v; want %q %v %v %v",
					o.MasterName, o.Addrs, o.SentinelPassword != "", o.IsClusterMode,
					tc.master, tc.addrs, tc.sentinelPW != "", tc.cluster)
			}
		})
	}
}

const sentinelValues = `
redis:
  mode: sentinel
  addrs: [sentinel-0.redis:26379, sentinel-1.redis:26379, sentinel-2.redis:26379]
  sentinel:
    masterName: ledger-master
    password: ` + sentinelPW + `
`

const clusterValues = `
redis:
  mode: cluster
  addrs: [redis-cluster-0.redis:6379]
`

const existingSecretsValues = `
database: {url: "", existingSecret: ledger-credentials, existingSecretKey: url}
redis: {url: "", existingSecret: redis-credentials, existingSecretKey: url}
adminToken: {value: "", existingSecret: admin-credentials, existingSecretKey: token}
`

// TestSecretsAreReferencedNotInlined: the secret settings appear in the
// chart's Secret and nowhere else, in any encoding.
func TestSecretsAreReferencedNotInlined(t *testing.T) {
	t.Parallel()
	r := mustRender(t, withExampleRoutes(t, sentinelValues, "serviceMonitor: {enabled: true}"))
	secretValues := []string{databaseURL, redisURL, adminToken, sentinelPW}
	var secrets int
	for _, o := range r.objects {
		if o.kind == "v1/Secret" {
			secrets++
			continue
		}
		for _, s := range secretValues {
			for _, form := range []string{s, base64.StdEncoding.EncodeToString([]byte(s))} {
				if strings.Contains(o.text, form) {
					t.Errorf("%s %s contains a secret value", o.kind, o.meta.GetName())
				}
			}
		}
	}
	for _, s := range secretValues {
		if strings.Contains(r.notes, s) {
			t.Error("NOTES.txt prints a secret value")
		}
	}
	sec := get[corev1.Secret](t, r, fullname)
	want := map[string]string{
		"database-url": databaseURL, "redis-url": redisURL,
		"redis-sentinel-password": sentinelPW, "admin-token": adminToken,
	}
	if len(sec.Data) != len(want) || secrets != 1 {
		t.Errorf("%d Secrets, keys %v; want one Secret with %v", secrets, slices.Sorted(mapKeys(sec.Data)), slices.Sorted(mapKeys(want)))
	}
	for k, v := range want {
		if string(sec.Data[k]) != v {
			t.Errorf("Secret key %s does not hold its value", k)
		}
	}
}

func mapKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

func TestExistingSecretsReplaceTheChartSecret(t *testing.T) {
	t.Parallel()
	r := mustRender(t, withExampleRoutes(t, existingSecretsValues, "serviceMonitor: {enabled: true}"))
	if s := all[corev1.Secret](r); len(s) != 0 {
		t.Errorf("rendered %d Secrets although every secret setting names an existing one", len(s))
	}
	d := get[appsv1.Deployment](t, r, fullname)
	if _, ok := d.Spec.Template.Annotations["checksum/secret"]; ok {
		t.Error("checksum/secret annotation without a chart Secret")
	}
	src := envSource(t, gatewayContainer(t, r))
	if src["GATEWAY_DATABASE_URL"] != "secret:ledger-credentials/url" || src["GATEWAY_ADMIN_TOKEN"] != "secret:admin-credentials/token" {
		t.Errorf("env sources %v do not name the existing Secrets", src)
	}
	job := get[batchv1.Job](t, r, fullname+"-migrate")
	if got := envSource(t, container(t, job.Spec.Template.Spec, "migrate"))["GATEWAY_DATABASE_URL"]; got != "secret:ledger-credentials/url" {
		t.Errorf("migration Job reads the database URL from %q", got)
	}
	sm := get[ServiceMonitor](t, r, fullname)
	if cr := sm.Spec.Endpoints[0].Authorization.Credentials; cr.Name != "admin-credentials" || cr.Key != "token" {
		t.Errorf("ServiceMonitor token from %s/%s, want admin-credentials/token", cr.Name, cr.Key)
	}
	if !strings.Contains(r.notes, "Secret admin-credentials") {
		t.Errorf("NOTES.txt does not say where the admin token is:\n%s", r.notes)
	}
}

func TestServicesSeparateIngestFromAdmin(t *testing.T) {
	t.Parallel()
	r := mustRender(t, withExampleRoutes(t))
	c := gatewayContainer(t, r)
	d := get[appsv1.Deployment](t, r, fullname)
	job := get[batchv1.Job](t, r, fullname+"-migrate")
	ingest := get[corev1.Service](t, r, fullname)
	admin := get[corev1.Service](t, r, fullname+"-admin")
	if len(all[corev1.Service](r)) != 2 {
		t.Fatalf("want exactly two Services, got %v", r.kinds())
	}
	wantTarget := map[*corev1.Service]int32{ingest: 8080, admin: 8081}
	for svc, want := range wantTarget {
		if len(svc.Spec.Ports) != 1 {
			t.Fatalf("Service %s: %d ports, want one", svc.Name, len(svc.Spec.Ports))
		}
		if got := containerPort(t, c, svc.Spec.Ports[0].TargetPort); got != want {
			t.Errorf("Service %s reaches container port %d, want %d", svc.Name, got, want)
		}
		sel := labels.SelectorFromSet(svc.Spec.Selector)
		if !sel.Matches(labels.Set(d.Spec.Template.Labels)) {
			t.Errorf("Service %s does not select the gateway pods", svc.Name)
		}
		if sel.Matches(labels.Set(job.Spec.Template.Labels)) {
			t.Errorf("Service %s selects the migration pod", svc.Name)
		}
		if svc.Spec.Type != corev1.ServiceTypeClusterIP {
			t.Errorf("Service %s type %s, want ClusterIP by default", svc.Name, svc.Spec.Type)
		}
	}
	if ingest.Spec.Ports[0].Port == admin.Spec.Ports[0].Port {
		t.Errorf("ingest and admin Services share port %d", ingest.Spec.Ports[0].Port)
	}
}

func TestMigrationJobIsAPreInstallAndPreUpgradeHook(t *testing.T) {
	t.Parallel()
	r := mustRender(t, withExampleRoutes(t))
	job := get[batchv1.Job](t, r, fullname+"-migrate")
	c := container(t, job.Spec.Template.Spec, "migrate")
	if !slices.Equal(c.Args, []string{"migrate"}) {
		t.Errorf("migration args %v, want [migrate]", c.Args)
	}
	if c.Image != gatewayContainer(t, r).Image {
		t.Errorf("migration image %q differs from the gateway's", c.Image)
	}
	if job.Spec.Template.Spec.RestartPolicy != corev1.RestartPolicyNever {
		t.Errorf("restartPolicy %s, want Never", job.Spec.Template.Spec.RestartPolicy)
	}
	if job.Spec.ActiveDeadlineSeconds == nil || job.Spec.BackoffLimit == nil {
		t.Error("the Job has no deadline or backoff limit, so an install could hang on it")
	}
	if job.Spec.Template.Spec.ServiceAccountName != "" {
		t.Errorf("the Job uses service account %q, which a pre-install hook runs before", job.Spec.Template.Spec.ServiceAccountName)
	}
	checkContainerHardened(t, c)
	src := envSource(t, c)
	if !strings.HasPrefix(src["GATEWAY_DATABASE_URL"], "secret:") {
		t.Errorf("migration reads the database URL from %q", src["GATEWAY_DATABASE_URL"])
	}
	if _, ok := src["GATEWAY_ADMIN_TOKEN"]; ok {
		t.Error("migration gets the admin token, which it does not need")
	}

	// Helm's own reading of the annotations.
	hooks := hookWeight(t, r)
	jh, sh := hooks["Job/"+fullname+"-migrate"], hooks["Secret/"+fullname]
	if jh == nil || sh == nil {
		t.Fatalf("hooks %v: want the Job and the chart's Secret", slices.Sorted(mapKeys(hooks)))
	}
	if !slices.Equal(jh.Events, []release.HookEvent{release.HookPreInstall, release.HookPreUpgrade}) {
		t.Errorf("Job hook events %v, want pre-install and pre-upgrade", jh.Events)
	}
	if !slices.Equal(sh.Events, []release.HookEvent{release.HookPreInstall, release.HookPreUpgrade, release.HookPreRollback}) {
		t.Errorf("Secret hook events %v, want pre-install, pre-upgrade (before the Job) and pre-rollback", sh.Events)
	}
	for _, h := range []*release.Hook{jh, sh} {
		if !slices.Contains(h.DeletePolicies, release.HookBeforeHookCreation) {
			t.Errorf("%s/%s: no before-hook-creation delete policy, so the next upgrade's hook would collide with it", h.Kind, h.Name)
		}
	}
	if !slices.Contains(jh.DeletePolicies, release.HookSucceeded) {
		t.Errorf("Job delete policies %v: want hook-succeeded", jh.DeletePolicies)
	}
	if sh.Weight >= jh.Weight {
		t.Errorf("Secret hook weight %d is not below the Job's %d: the Job could start before its database URL exists", sh.Weight, jh.Weight)
	}
	if len(hooks) != 2 {
		t.Errorf("hooks %v: only the Job and the Secret should be hooks", slices.Sorted(mapKeys(hooks)))
	}

	off := mustRender(t, withExampleRoutes(t, "migration: {enabled: false}"))
	if len(all[batchv1.Job](off)) != 0 {
		t.Error("migration.enabled=false still renders a Job")
	}
}

func TestAutoscalingAndDisruptionBudget(t *testing.T) {
	t.Parallel()
	off := mustRender(t, withExampleRoutes(t))
	if len(all[autoscalingv2.HorizontalPodAutoscaler](off)) != 0 {
		t.Error("an HPA is rendered while autoscaling is off")
	}

	on := mustRender(t, withExampleRoutes(t, "autoscaling: {enabled: true, minReplicas: 3, maxReplicas: 12, targetMemoryUtilizationPercentage: 80}"))
	d := get[appsv1.Deployment](t, on, fullname)
	if d.Spec.Replicas != nil {
		t.Errorf("replicas %d set on the Deployment while the HPA owns the count", *d.Spec.Replicas)
	}
	hpa := get[autoscalingv2.HorizontalPodAutoscaler](t, on, fullname)
	ref := hpa.Spec.ScaleTargetRef
	if ref.APIVersion != "apps/v1" || ref.Kind != "Deployment" || ref.Name != d.Name {
		t.Errorf("HPA targets %+v, want the Deployment", ref)
	}
	if hpa.Spec.MinReplicas == nil || *hpa.Spec.MinReplicas != 3 || hpa.Spec.MaxReplicas != 12 {
		t.Errorf("HPA bounds %v..%d, want 3..12", hpa.Spec.MinReplicas, hpa.Spec.MaxReplicas)
	}
	targets := map[corev1.ResourceName]int32{}
	for _, m := range hpa.Spec.Metrics {
		if m.Type == autoscalingv2.ResourceMetricSourceType && m.Resource.Target.AverageUtilization != nil {
			targets[m.Resource.Name] = *m.Resource.Target.AverageUtilization
		}
	}
	if targets[corev1.ResourceCPU] != 70 || targets[corev1.ResourceMemory] != 80 || len(hpa.Spec.Metrics) != 2 {
		t.Errorf("HPA metrics %v, want cpu 70%% and memory 80%%", targets)
	}

	for _, r := range []*rendered{off, on} {
		pdb := get[policyv1.PodDisruptionBudget](t, r, fullname)
		if pdb.Spec.MaxUnavailable == nil || pdb.Spec.MaxUnavailable.IntValue() != 1 || pdb.Spec.MinAvailable != nil {
			t.Errorf("PDB %+v, want maxUnavailable 1", pdb.Spec)
		}
		sel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
		if err != nil {
			t.Fatal(err)
		}
		if !sel.Matches(labels.Set(get[appsv1.Deployment](t, r, fullname).Spec.Template.Labels)) {
			t.Error("the PDB does not select the gateway pods")
		}
		if sel.Matches(labels.Set(get[batchv1.Job](t, r, fullname+"-migrate").Spec.Template.Labels)) {
			t.Error("the PDB selects the migration pod")
		}
	}
	pct := mustRender(t, withExampleRoutes(t, `podDisruptionBudget: {maxUnavailable: "25%"}`))
	if got := get[policyv1.PodDisruptionBudget](t, pct, fullname).Spec.MaxUnavailable; got.String() != "25%" {
		t.Errorf("PDB maxUnavailable %v, want 25%%", got)
	}
	nopdb := mustRender(t, withExampleRoutes(t, "podDisruptionBudget: {enabled: false}"))
	if len(all[policyv1.PodDisruptionBudget](nopdb)) != 0 {
		t.Error("podDisruptionBudget.enabled=false still renders a PDB")
	}
}

func TestServiceMonitorScrapesAdminWithTheToken(t *testing.T) {
	t.Parallel()
	if r := mustRender(t, withExampleRoutes(t)); len(all[ServiceMonitor](r)) != 0 {
		t.Error("a ServiceMonitor is rendered by default; it needs CRDs that may be missing")
	}
	r := mustRender(t, withExampleRoutes(t, "serviceMonitor: {enabled: true, interval: 15s, labels: {release: prometheus}}"))
	sm := get[ServiceMonitor](t, r, fullname)
	admin := get[corev1.Service](t, r, fullname+"-admin")
	ingest := get[corev1.Service](t, r, fullname)
	sel, err := metav1.LabelSelectorAsSelector(&sm.Spec.Selector)
	if err != nil {
		t.Fatal(err)
	}
	if !sel.Matches(labels.Set(admin.Labels)) || sel.Matches(labels.Set(ingest.Labels)) {
		t.Errorf("ServiceMonitor selector %v: want the admin Service %v and not the ingest one %v", sel, admin.Labels, ingest.Labels)
	}
	if !slices.Equal(sm.Spec.NamespaceSelector.MatchNames, []string{namespace}) {
		t.Errorf("namespaceSelector %+v, want the release namespace", sm.Spec.NamespaceSelector)
	}
	if sm.Labels["release"] != "prometheus" {
		t.Errorf("labels %v lack serviceMonitor.labels", sm.Labels)
	}
	if len(sm.Spec.Endpoints) != 1 {
		t.Fatalf("endpoints %+v, want one", sm.Spec.Endpoints)
	}
	ep := sm.Spec.Endpoints[0]
	if ep.Port != admin.Spec.Ports[0].Name || ep.Path != "/metrics" || ep.Interval != "15s" {
		t.Errorf("endpoint %+v, want port %q path /metrics interval 15s", ep, admin.Spec.Ports[0].Name)
	}
	token := envSource(t, gatewayContainer(t, r))["GATEWAY_ADMIN_TOKEN"]
	if ep.Authorization == nil || ep.Authorization.Type != "Bearer" || ep.Authorization.Credentials == nil ||
		"secret:"+ep.Authorization.Credentials.Name+"/"+ep.Authorization.Credentials.Key != token {
		t.Errorf("authorization %+v, want Bearer from the gateway's own %s", ep.Authorization, token)
	}

	// With a metrics-only token, Prometheus holds that one, not the admin token.
	for _, extra := range []string{
		"metricsToken: {value: metrics-token-0123456789}",
		"metricsToken: {existingSecret: scrape, existingSecretKey: token}",
	} {
		r := mustRender(t, withExampleRoutes(t, "serviceMonitor: {enabled: true}", extra))
		ep := get[ServiceMonitor](t, r, fullname).Spec.Endpoints[0]
		env := envSource(t, gatewayContainer(t, r))
		metrics := env["GATEWAY_METRICS_TOKEN"]
		if metrics == "" || metrics == env["GATEWAY_ADMIN_TOKEN"] || ep.Authorization == nil || ep.Authorization.Credentials == nil ||
			"secret:"+ep.Authorization.Credentials.Name+"/"+ep.Authorization.Credentials.Key != metrics {
			t.Errorf("%s: authorization %+v, want Bearer from the metrics token %q (admin %q)", extra, ep.Authorization, metrics, env["GATEWAY_ADMIN_TOKEN"])
		}
	}
	if _, err := render(t, withExampleRoutes(t, "metricsToken: {value: "+adminToken+"}")); err == nil || !strings.Contains(err.Error(), "metricsToken: must differ from adminToken") {
		t.Errorf("a metrics token equal to the admin token was accepted: %v", err)
	}
}

// TestRoutesConfigMap: both ways of giving routes produce a file the gateway
// parses to the same contracts, routesFile verbatim, and a change of routes
// changes the pod template (so pods roll) while the same routes do not.
func TestRoutesConfigMap(t *testing.T) {
	t.Parallel()
	raw := exampleRoutes(t)
	structured := mustRender(t, withExampleRoutes(t))
	verbatim := mustRender(t, values(t, minimal, "routesFile: |\n"+indent(raw, "  ")))

	if got := routesFile(t, verbatim); got != raw {
		t.Errorf("routesFile is not mounted verbatim:\n%s", got)
	}
	want, err := config.ParseRoutes([]byte(raw))
	if err != nil {
		t.Fatal(err)
	}
	for name, r := range map[string]*rendered{"routes": structured, "routesFile": verbatim} {
		got, err := config.ParseRoutes([]byte(routesFile(t, r)))
		if err != nil {
			t.Fatalf("%s: the gateway rejects the mounted file: %v", name, err)
		}
		if len(got) != len(want) {
			t.Fatalf("%s: %d routes, want %d", name, len(got), len(want))
		}
		for i := range want {
			if got[i].Name != want[i].Name || got[i].ContractVersion != want[i].ContractVersion {
				t.Errorf("%s: route %s contract %s, want %s %s (values changed on the way through Helm)",
					name, got[i].Name, got[i].ContractVersion, want[i].Name, want[i].ContractVersion)
			}
		}
		// The checksum annotation is the hash of exactly the mounted file.
		sum := sha256.Sum256([]byte(routesFile(t, r)))
		if got := get[appsv1.Deployment](t, r, fullname).Spec.Template.Annotations["checksum/routes"]; got != hex.EncodeToString(sum[:]) {
			t.Errorf("%s: checksum/routes %q is not the mounted file's sha256", name, got)
		}
	}

	checksum := func(r *rendered) string {
		return get[appsv1.Deployment](t, r, fullname).Spec.Template.Annotations["checksum/routes"]
	}
	again := mustRender(t, withExampleRoutes(t))
	changed := mustRender(t, withExampleRoutes(t, strings.Replace(raw, "max_attempts: 5", "max_attempts: 6", 1)))
	if checksum(again) != checksum(structured) {
		t.Error("the same routes give a different checksum: pods would roll for nothing")
	}
	if checksum(changed) == checksum(structured) {
		t.Error("changed routes keep the checksum: pods would keep the old routes")
	}
	secretChanged := mustRender(t, withExampleRoutes(t, "adminToken: {value: another-admin-token-123}"))
	if get[appsv1.Deployment](t, secretChanged, fullname).Spec.Template.Annotations["checksum/secret"] ==
		get[appsv1.Deployment](t, structured, fullname).Spec.Template.Annotations["checksum/secret"] {
		t.Error("a changed chart-held secret keeps checksum/secret: pods would keep the old token")
	}
}

func indent(s, prefix string) string {
	lines := strings.SplitAfter(s, "\n")
	for i, l := range lines {
		if strings.TrimSpace(l) != "" {
			lines[i] = prefix + l
		}
	}
	return strings.Join(lines, "")
}

func TestNotes(t *testing.T) {
	t.Parallel()
	r := mustRender(t, withExampleRoutes(t))
	for _, want := range []string{
		"POST https://<your host>/v1/push/pubsub/orders",
		"POST https://<your host>/v1/push/pubsub/payments",
		"port-forward svc/gw-ackgate-admin 8081",
		"WARNING: route orders has auth: none",
		"Secret gw-ackgate",
	} {
		if !strings.Contains(r.notes, want) {
			t.Errorf("NOTES.txt lacks %q:\n%s", want, r.notes)
		}
	}
}

// TestValuesAreRejected: the schema refuses misspelt and ill-typed values,
// and the templates refuse combinations the schema cannot see, each with a
// message naming the value.
func TestValuesAreRejected(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, values, want string
	}{
		{"unknown top-level key", "replicas: 3", "replicas"},
		{"unknown nested key", "gateway: {logLevl: debug}", "logLevl"},
		{"unknown key in redis", "redis: {sentinelMaster: m}", "sentinelMaster"},
		{"wrong type", "replicaCount: two", "replicaCount"},
		{"unknown Redis mode", "redis: {mode: replica}", "mode"},
		{"sentinel without master name", "redis: {mode: sentinel, addrs: [s:26379]}", "masterName"},
		{"sentinel without addresses", "redis: {mode: sentinel, sentinel: {masterName: m}}", "addrs"},
		{"cluster without addresses", "redis: {mode: cluster}", "addrs"},
		{"addresses in standalone mode", "redis: {addrs: [r:6379]}", "addrs"},
		{"address without port", "redis: {mode: cluster, addrs: [redis-cluster]}", "addrs"},
		{"Sentinel password in cluster mode", "redis: {mode: cluster, addrs: [r:6379], sentinel: {password: x}}", "password"},
		{"short admin token", "adminToken: {value: short}", "at '/adminToken/value': minLength: got 5, want 16"},
		{"short metrics token", "metricsToken: {value: short}", "at '/metricsToken/value': minLength: got 5, want 16"},
		{"short key hash secret", "keyHashSecret: {value: short}", "at '/keyHashSecret/value': minLength: got 5, want 32"},
		{"ingress without hosts", "ingress: {enabled: true}", "ingress.hosts"},
		{"HTTPRoute without a Gateway", "httpRoute: {enabled: true}", "httpRoute.parentRefs"},
		{"unknown NetworkPolicy field", "networkPolicy: {enabled: true, from: []}", "from"},
		{"bad duration", "gateway: {writeTimeout: 60}", "writeTimeout"},
		{"bad log level", "gateway: {logLevel: verbose}", "logLevel"},
		{"body limit over the gateway's", "gateway: {maxBodyBytes: 67108864}", "maxBodyBytes"},
		{"ingest Service of an unknown type", "service: {ingest: {type: ExternalName}}", "type"},
		{"admin Service as a load balancer", "service: {admin: {type: LoadBalancer}}", "type"},
		{"unknown probe field", "probes: {liveness: {path: /}}", "path"},
		{"unknown resource section", "resources: {request: {cpu: 1}}", "request"},
		{"unknown ServiceMonitor field", "serviceMonitor: {enabled: true, path: /m}", "path"},

		{"no database", "database: {url: ''}", "database.url or database.existingSecret"},
		{"URL and existing Secret", "database: {existingSecret: ledger}", "database: set the value or existingSecret, not both"},
		{"no admin token", "adminToken: {value: ''}", "adminToken.value or adminToken.existingSecret"},
		{"standalone without URL", "redis: {url: ''}", "standalone mode needs redis.url"},
		{"routes and routesFile", "routesFile: 'routes: []'", "routes or routesFile, not both"},
		{"same ports", "ports: {admin: 8080}", "ingest and admin must differ"},
		{"HPA bounds crossed", "autoscaling: {enabled: true, minReplicas: 5, maxReplicas: 3}", "minReplicas is larger"},
		{"extraEnv overriding the chart", "extraEnv: [{name: GATEWAY_ADMIN_TOKEN, value: x}]", "GATEWAY_ADMIN_TOKEN is set by the chart"},
		{"no image", "image: {repository: ''}", "image.repository is required"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := render(t, withExampleRoutes(t, tc.values))
			if err == nil {
				t.Fatalf("values %q were accepted", tc.values)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error does not mention %q:\n%v", tc.want, err)
			}
		})
	}
	t.Run("no routes", func(t *testing.T) {
		t.Parallel()
		_, err := render(t, values(t, minimal))
		if err == nil || !strings.Contains(err.Error(), "set routes") {
			t.Errorf("rendering without routes: %v", err)
		}
	})
}

// TestStrictDecoding proves the decoder the other tests rely on refuses what
// an API server with strict field validation refuses.
func TestStrictDecoding(t *testing.T) {
	t.Parallel()
	r := mustRender(t, withExampleRoutes(t))
	var deployment string
	for _, o := range r.objects {
		if o.kind == "apps/v1/Deployment" {
			deployment = o.text
		}
	}
	if _, _, err := decodeStrict([]byte(deployment)); err != nil {
		t.Fatalf("the rendered Deployment itself: %v", err)
	}
	for name, mutate := range map[string]func(string) string{
		"misspelt field": func(s string) string { return strings.Replace(s, "livenessProbe:", "livenesProbe:", 1) },
		"field in the wrong case": func(s string) string {
			return strings.Replace(s, "readinessProbe:", "ReadinessProbe:", 1)
		},
		"duplicate key": func(s string) string {
			return strings.Replace(s, "  revisionHistoryLimit: 5", "  revisionHistoryLimit: 5\n  revisionHistoryLimit: 6", 1)
		},
		"field from another kind": func(s string) string {
			return strings.Replace(s, "  revisionHistoryLimit: 5", "  revisionHistoryLimit: 5\n  backoffLimit: 1", 1)
		},
		"unknown kind": func(s string) string { return strings.Replace(s, "kind: Deployment", "kind: Deploymnet", 1) },
	} {
		bad := mutate(deployment)
		if bad == deployment {
			t.Fatalf("%s: the mutation did not apply", name)
		}
		if _, _, err := decodeStrict([]byte(bad)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}

	sm := `apiVersion: monitoring.coreos.com/v1
kind: ServiceMonitor
metadata: {name: x}
spec:
  selector: {}
  endpoints: [{port: admin, bearerTokenSecrets: {name: x, key: y}}]
`
	if _, _, err := decodeStrict([]byte(sm)); err == nil {
		t.Error("a ServiceMonitor with an unknown endpoint field was accepted")
	}
}

// TestChartFilesAreTheOnesTested guards against a template that no test
// renders: every file under templates/ must produce output in one of the
// value sets above or be a helper.
func TestChartFilesAreTheOnesTested(t *testing.T) {
	t.Parallel()
	everything := mustRender(t, withExampleRoutes(t, sentinelValues, `
autoscaling: {enabled: true}
serviceMonitor: {enabled: true}
prometheusRule: {enabled: true}
networkPolicy: {enabled: true}
ingress: {enabled: true, hosts: [push.example.com]}
httpRoute: {enabled: true, parentRefs: [{name: public}]}
`))
	entries, err := os.ReadDir(filepath.Join(chartDir, "templates"))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		name := e.Name()
		if strings.HasPrefix(name, "_") || name == "NOTES.txt" {
			continue
		}
		var produced bool
		for _, o := range everything.objects {
			produced = produced || path.Base(o.source) == name
		}
		if !produced {
			t.Errorf("templates/%s renders nothing even with every feature on", name)
		}
	}
}

// leftToExtraEnv are the gateway settings the chart deliberately has no value
// for; anything else `gateway help env` lists must be set by the chart.
var leftToExtraEnv = map[string]string{
	"GATEWAY_SNS_TRUSTED_URL_PREFIXES": "trusts extra certificate hosts; for SNS emulators only",
	"GATEWAY_ADMIN_TOKENS_FILE":        "the chart passes named credentials as GATEWAY_ADMIN_TOKENS from a Secret; a file is for installs without one",
}

// runtimeEnv are the variables the chart sets for the Go runtime rather than
// for the gateway's settings.
var runtimeEnv = map[string]bool{"GODEBUG": true}

// TestChartCoversEverySetting compares the variables the gateway reads
// (config.Usage, the table behind `gateway help env`) with those the chart
// sets across its modes. A setting added to config/settings.go fails here
// until the chart sets it (values.yaml, values.schema.json, deployment.yaml
// and the list in ackgate.validate) or it is added to leftToExtraEnv with a
// reason. Every variable the chart sets is also refused in extraEnv.
func TestChartCoversEverySetting(t *testing.T) {
	t.Parallel()
	var usage strings.Builder
	if err := config.Usage(&usage); err != nil {
		t.Fatal(err)
	}
	gateway := map[string]bool{}
	for _, v := range regexp.MustCompile(`\bGATEWAY_[A-Z0-9_]+\b`).FindAllString(usage.String(), -1) {
		gateway[v] = true
	}
	if len(gateway) < 10 {
		t.Fatalf("config.Usage listed only %v", gateway)
	}
	chart := map[string]bool{}
	for _, extra := range []string{sentinelValues, clusterValues, "gateway: {oidcJwksUrl: 'https://keys.example.com/jwks'}", "metricsToken: {value: metrics-token-0123456789}",
		"keyHashSecret: {value: key-hash-secret-0123456789abcdef0123}",
		"adminTokens: {value: alice=alice-token-0123456789}",
		"outboxKey: {value: 'k1:" + outboxKeyValue + "'}\noutboxOldKeys: {value: 'k0:" + outboxKeyValue + "'}",
		"console: {traceURL: 'https://traces.example.com/trace/{trace_id}'}"} {
		for k := range envSource(t, gatewayContainer(t, mustRender(t, withExampleRoutes(t, extra)))) {
			chart[k] = true
		}
	}
	for v := range gateway {
		if !chart[v] && leftToExtraEnv[v] == "" {
			t.Errorf("the gateway reads %s but the chart never sets it", v)
		}
	}
	for v := range chart {
		if !gateway[v] && !runtimeEnv[v] {
			t.Errorf("the chart sets %s, which the gateway does not read", v)
		}
		_, err := render(t, withExampleRoutes(t, fmt.Sprintf("extraEnv: [{name: %s, value: x}]", v)))
		if err == nil || !strings.Contains(err.Error(), v+" is set by the chart") {
			t.Errorf("extraEnv may override %s: %v", v, err)
		}
	}
	for v := range leftToExtraEnv {
		if !gateway[v] {
			t.Errorf("leftToExtraEnv names %s, which the gateway no longer reads", v)
		}
	}
}

// TestExtraEnvPassesThrough: route credentials and OTEL_* settings reach the
// container as written, after the chart's own variables.
func TestExtraEnvPassesThrough(t *testing.T) {
	t.Parallel()
	r := mustRender(t, withExampleRoutes(t, `
extraEnv:
  - name: OTEL_SERVICE_NAME
    value: ackgate
  - name: ORDERS_SNS_BASIC_PASSWORD
    valueFrom:
      secretKeyRef: {name: route-credentials, key: orders-password}
extraEnvFrom:
  - secretRef: {name: otel-headers}
`))
	c := gatewayContainer(t, r)
	src := envSource(t, c)
	if src["OTEL_SERVICE_NAME"] != "value:ackgate" || src["ORDERS_SNS_BASIC_PASSWORD"] != "secret:route-credentials/orders-password" {
		t.Errorf("extra variables arrive as %q and %q", src["OTEL_SERVICE_NAME"], src["ORDERS_SNS_BASIC_PASSWORD"])
	}
	if len(c.EnvFrom) != 1 || c.EnvFrom[0].SecretRef == nil || c.EnvFrom[0].SecretRef.Name != "otel-headers" {
		t.Errorf("envFrom %+v, want the otel-headers Secret", c.EnvFrom)
	}
	if last := c.Env[len(c.Env)-1].Name; last != "ORDERS_SNS_BASIC_PASSWORD" {
		t.Errorf("last variable %s: extra variables should follow the chart's", last)
	}
}

// TestKeyHashSecret: the secret that private operation keys are hashed with
// reaches the gateway from a Secret (the chart's own or an existing one),
// never inline, and is set only when given; a short one is refused.
func TestKeyHashSecret(t *testing.T) {
	t.Parallel()
	const secret = "key-hash-secret-0123456789abcdef0123"
	if _, set := envSource(t, gatewayContainer(t, mustRender(t, withExampleRoutes(t))))["GATEWAY_KEY_HASH_SECRET"]; set {
		t.Error("GATEWAY_KEY_HASH_SECRET is set without a value")
	}
	r := mustRender(t, withExampleRoutes(t, "keyHashSecret: {value: "+secret+"}"))
	if got := envSource(t, gatewayContainer(t, r))["GATEWAY_KEY_HASH_SECRET"]; got != "secret:"+fullname+"/key-hash-secret" {
		t.Errorf("GATEWAY_KEY_HASH_SECRET from %q, want the chart's Secret", got)
	}
	if sec := get[corev1.Secret](t, r, fullname); string(sec.Data["key-hash-secret"]) != secret {
		t.Error("the chart's Secret does not hold the key hash secret")
	}
	for _, o := range r.objects {
		if o.kind != "v1/Secret" && strings.Contains(o.text, secret) {
			t.Errorf("%s %s contains the key hash secret", o.kind, o.meta.GetName())
		}
	}
	r = mustRender(t, withExampleRoutes(t, "keyHashSecret: {existingSecret: hashing, existingSecretKey: hmac}"))
	if got := envSource(t, gatewayContainer(t, r))["GATEWAY_KEY_HASH_SECRET"]; got != "secret:hashing/hmac" {
		t.Errorf("GATEWAY_KEY_HASH_SECRET from %q, want the existing Secret", got)
	}
	if _, err := render(t, withExampleRoutes(t, "keyHashSecret: {value: too-short}")); err == nil {
		t.Error("a key hash secret shorter than 32 characters was accepted")
	}
}

// The background work's settings reach the container as written, and the
// gateway reads them back as its own.
func TestBackgroundWorkSettings(t *testing.T) {
	t.Parallel()
	src := envSource(t, gatewayContainer(t, mustRender(t, withExampleRoutes(t,
		"gateway: {fenceTtl: 48h, lanesRefresh: 30s, reconcilePoll: 2s, purgeInterval: 5m, purgeBatch: 2000, relayPoll: 250ms, relayConcurrency: 8}"))))
	want := map[string]string{
		"GATEWAY_FENCE_TTL": "value:48h", "GATEWAY_LANES_REFRESH": "value:30s", "GATEWAY_RECONCILE_POLL": "value:2s",
		"GATEWAY_PURGE_INTERVAL": "value:5m", "GATEWAY_PURGE_BATCH": "value:2000",
		"GATEWAY_RELAY_POLL": "value:250ms", "GATEWAY_RELAY_CONCURRENCY": "value:8",
	}
	env := map[string]string{}
	for k, v := range want {
		if src[k] != v {
			t.Errorf("%s = %q, want %q", k, src[k], v)
		}
		env[k] = strings.TrimPrefix(src[k], "value:")
	}
	s, err := config.LoadSettings(func(k string) string { return env[k] })
	if err != nil || s.FenceTTL != 48*time.Hour || s.PurgeBatch != 2000 || s.RelayPoll != 250*time.Millisecond || s.RelayConcurrency != 8 {
		t.Errorf("settings from the chart's values: %+v, %v", s, err)
	}
	if _, err := render(t, withExampleRoutes(t, "gateway: {purgeBatch: 0}")); err == nil {
		t.Error("a purge batch of 0 was accepted")
	}
	if _, err := render(t, withExampleRoutes(t, "gateway: {relayConcurrency: 0}")); err == nil {
		t.Error("a relay concurrency of 0 was accepted")
	}
}

// TestConsoleSettings: the operator console's values reach the gateway, and
// a trace viewer URL without its placeholder is refused at install.
func TestConsoleSettings(t *testing.T) {
	t.Parallel()
	env := envSource(t, gatewayContainer(t, mustRender(t, withExampleRoutes(t))))
	for k, want := range map[string]string{
		"GATEWAY_CONSOLE_ENABLED": "value:true", "GATEWAY_CONSOLE_SESSION_TTL": "value:8h", "GATEWAY_CONSOLE_ALLOW_HTTP": "value:false",
	} {
		if env[k] != want {
			t.Errorf("default %s = %q, want %q", k, env[k], want)
		}
	}
	if _, ok := env["GATEWAY_CONSOLE_TRACE_URL"]; ok {
		t.Error("an empty traceURL is passed on")
	}
	env = envSource(t, gatewayContainer(t, mustRender(t, withExampleRoutes(t,
		"console: {enabled: false, sessionTTL: 1h, allowHTTP: true, traceURL: 'https://grafana.example/explore?traceId={trace_id}'}"))))
	for k, want := range map[string]string{
		"GATEWAY_CONSOLE_ENABLED": "value:false", "GATEWAY_CONSOLE_SESSION_TTL": "value:1h", "GATEWAY_CONSOLE_ALLOW_HTTP": "value:true",
		"GATEWAY_CONSOLE_TRACE_URL": "value:https://grafana.example/explore?traceId={trace_id}",
	} {
		if env[k] != want {
			t.Errorf("%s = %q, want %q", k, env[k], want)
		}
	}
	for _, bad := range []string{"console: {traceURL: 'https://grafana.example/explore'}", "console: {sessionTTL: forever}", "console: {theme: dark}"} {
		if _, err := render(t, withExampleRoutes(t, bad)); err == nil {
			t.Errorf("%s was accepted", bad)
		}
	}
}

// TestMemoryLimit: by default the container's memory limit reaches the
// gateway as GATEWAY_MEMORY_LIMIT, which then gives the Go runtime 90% of it
// (less where 10% would not leave 32MiB); a size passes as written, and
// without a limit or with "" nothing is set.
func TestMemoryLimit(t *testing.T) {
	t.Parallel()
	settings := func(t *testing.T, values ...string) (map[string]string, config.Settings) {
		t.Helper()
		r := mustRender(t, withExampleRoutes(t, values...))
		c := gatewayContainer(t, r)
		env := resolveEnv(t, r, c, nil)
		s, err := config.LoadSettings(func(k string) string { return env[k] })
		if err != nil {
			t.Fatalf("gateway settings: %v", err)
		}
		return envSource(t, c), s
	}
	src, s := settings(t)
	if src["GATEWAY_MEMORY_LIMIT"] != "resource:gateway/limits.memory" || src["GATEWAY_MEMORY_LIMIT_RATIO"] != "value:0.9" {
		t.Errorf("default: GATEWAY_MEMORY_LIMIT from %q, ratio %q", src["GATEWAY_MEMORY_LIMIT"], src["GATEWAY_MEMORY_LIMIT_RATIO"])
	}
	if s.MemoryLimit != 256<<20 || s.SoftMemoryLimit() != 224<<20 {
		t.Errorf("default: limit %d, soft %d; want the container's 256Mi less the 32MiB the runtime does not count", s.MemoryLimit, s.SoftMemoryLimit())
	}

	src, s = settings(t, "gateway: {memoryLimit: 200MiB, memoryLimitRatio: 0.8}")
	if src["GATEWAY_MEMORY_LIMIT"] != "value:200MiB" || s.SoftMemoryLimit() != 160<<20 {
		t.Errorf("explicit size: %q, soft %d; want 200MiB and %d", src["GATEWAY_MEMORY_LIMIT"], s.SoftMemoryLimit(), 160<<20)
	}
	for _, values := range []string{`gateway: {memoryLimit: ""}`, "resources: {limits: null}"} {
		src, s = settings(t, values)
		if v, ok := src["GATEWAY_MEMORY_LIMIT"]; ok || s.SoftMemoryLimit() != 0 {
			t.Errorf("%s: GATEWAY_MEMORY_LIMIT %q, soft limit %d; want none", values, v, s.SoftMemoryLimit())
		}
	}
	for _, values := range []string{"gateway: {memoryLimit: 200M}", "gateway: {memoryLimit: half}", "gateway: {memoryLimitRatio: 0.3}"} {
		if _, err := render(t, withExampleRoutes(t, values)); err == nil {
			t.Errorf("%s was accepted", values)
		}
	}
}

// TestGodebug: the chart starts goroutines with the smallest stack by
// default; "" leaves GODEBUG to the image's own or to extraEnv, which may
// not set it beside the chart's own.
func TestGodebug(t *testing.T) {
	t.Parallel()
	src := envSource(t, gatewayContainer(t, mustRender(t, withExampleRoutes(t))))
	if src["GODEBUG"] != "value:adaptivestackstart=0" {
		t.Errorf("default GODEBUG from %q", src["GODEBUG"])
	}
	src = envSource(t, gatewayContainer(t, mustRender(t, withExampleRoutes(t, `gateway: {godebug: ""}`, "extraEnv: [{name: GODEBUG, value: madvdontneed=1}]"))))
	if src["GODEBUG"] != "value:madvdontneed=1" {
		t.Errorf("GODEBUG from extraEnv with gateway.godebug empty: %q", src["GODEBUG"])
	}
	for _, values := range []string{"gateway: {godebug: 'adaptivestackstart = 0'}", "gateway: {godebug: 'a=1,,b=2'}"} {
		if _, err := render(t, withExampleRoutes(t, values)); err == nil {
			t.Errorf("%s was accepted", values)
		}
	}
}

// outboxKeyValue is 32 bytes in base64.
const outboxKeyValue = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8="

// TestNamedAdminTokensAndOutboxKeys: named admin credentials and the outbox
// keys reach the gateway from Secrets (the chart's own or existing ones),
// never inline, and only when given; named credentials may stand in for the
// single admin token; old outbox keys need a current one.
func TestNamedAdminTokensAndOutboxKeys(t *testing.T) {
	t.Parallel()
	plain := envSource(t, gatewayContainer(t, mustRender(t, withExampleRoutes(t))))
	for _, v := range []string{"GATEWAY_ADMIN_TOKENS", "GATEWAY_OUTBOX_KEY", "GATEWAY_OUTBOX_OLD_KEYS"} {
		if _, set := plain[v]; set {
			t.Errorf("%s is set without a value", v)
		}
	}
	const tokens = "alice=alice-token-0123456789,bob=sha256:" + "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"
	r := mustRender(t, withExampleRoutes(t, "adminTokens: {value: '"+tokens+"'}",
		"outboxKey: {value: 'k2:"+outboxKeyValue+"'}", "outboxOldKeys: {value: 'k1:"+outboxKeyValue+"'}"))
	src := envSource(t, gatewayContainer(t, r))
	for v, key := range map[string]string{"GATEWAY_ADMIN_TOKENS": "admin-tokens", "GATEWAY_OUTBOX_KEY": "outbox-key", "GATEWAY_OUTBOX_OLD_KEYS": "outbox-old-keys"} {
		if got := src[v]; got != "secret:"+fullname+"/"+key {
			t.Errorf("%s from %q, want the chart's Secret", v, got)
		}
	}
	sec := get[corev1.Secret](t, r, fullname)
	if string(sec.Data["admin-tokens"]) != tokens || string(sec.Data["outbox-key"]) != "k2:"+outboxKeyValue {
		t.Error("the chart's Secret does not hold the named tokens and the outbox key")
	}
	for _, o := range r.objects {
		if o.kind != "v1/Secret" && (strings.Contains(o.text, "alice-token-0123456789") || strings.Contains(o.text, outboxKeyValue)) {
			t.Errorf("%s %s contains a secret", o.kind, o.meta.GetName())
		}
	}
	// Named credentials alone: no GATEWAY_ADMIN_TOKEN at all.
	named := envSource(t, gatewayContainer(t, mustRender(t, withExampleRoutes(t, "adminToken: {value: ''}", "adminTokens: {value: '"+tokens+"'}"))))
	if _, set := named["GATEWAY_ADMIN_TOKEN"]; set || named["GATEWAY_ADMIN_TOKENS"] == "" {
		t.Errorf("named credentials only: %v", named)
	}
	if _, err := render(t, withExampleRoutes(t, "adminToken: {value: ''}")); err == nil || !strings.Contains(err.Error(), "adminTokens") {
		t.Errorf("no credential at all: %v", err)
	}
	r = mustRender(t, withExampleRoutes(t, "outboxKey: {existingSecret: sealing, existingSecretKey: current}"))
	if got := envSource(t, gatewayContainer(t, r))["GATEWAY_OUTBOX_KEY"]; got != "secret:sealing/current" {
		t.Errorf("GATEWAY_OUTBOX_KEY from %q, want the existing Secret", got)
	}
	if _, err := render(t, withExampleRoutes(t, "outboxKey: {value: 'k1:too-short'}")); err == nil {
		t.Error("an outbox key that is not 32 bytes was accepted")
	}
	if _, err := render(t, withExampleRoutes(t, "outboxOldKeys: {value: 'k1:"+outboxKeyValue+"'}")); err == nil || !strings.Contains(err.Error(), "outboxOldKeys") {
		t.Errorf("old outbox keys without a current one: %v", err)
	}
}
