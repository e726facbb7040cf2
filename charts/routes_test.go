package charts

import (
	"encoding/json"
	"maps"
	"slices"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"

	"github.com/ackgate/ackgate/config"
)

// The chart's routes vocabulary (the keys of each section, the values of
// each enumerated field) is the gateway's: a field added to the routes file
// or a value added to an enum fails here until the chart knows it too.
func TestChartKnowsTheRoutesVocabulary(t *testing.T) {
	t.Parallel()
	ch, err := loader.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	ch.Templates = append(ch.Templates, &chart.File{Name: "templates/vocabulary.json", Data: []byte(`{{ include "ackgate.routeVocabulary" . }}`)})
	rv, err := chartutil.ToRenderValues(ch, withExampleRoutes(t), chartutil.ReleaseOptions{Name: releaseName, Namespace: namespace}, chartutil.DefaultCapabilities)
	if err != nil {
		t.Fatal(err)
	}
	files, err := engine.Engine{Strict: true}.Render(ch, rv)
	if err != nil {
		t.Fatal(err)
	}
	var got struct{ Fields, Enums map[string][]string }
	if err := json.Unmarshal([]byte(files["ackgate/templates/vocabulary.json"]), &got); err != nil {
		t.Fatal(err)
	}
	fields, enums := config.RouteFileVocabulary()
	for _, c := range []struct {
		what      string
		chart, gw map[string][]string
	}{{"fields", got.Fields, fields}, {"enums", got.Enums, enums}} {
		for _, k := range slices.Sorted(maps.Keys(c.gw)) {
			if !slices.Equal(c.chart[k], c.gw[k]) {
				t.Errorf("%s %q: the chart has %v, the gateway %v", c.what, k, c.chart[k], c.gw[k])
			}
		}
		for k := range c.chart {
			if _, ok := c.gw[k]; !ok {
				t.Errorf("%s %q: in the chart, not in the gateway's routes file", c.what, k)
			}
		}
	}
}

// A routes file the gateway would refuse at start fails the render, as
// `helm template`, `helm install` and `helm upgrade` run it, whether the
// routes come as the routes list or as a whole routesFile, and the error
// names the route and the field.
func TestBadRoutesFailTheRender(t *testing.T) {
	t.Parallel()
	const good = `{name: first, broker: pubsub, auth: none, shape: idempotent, dedupe_window: 1h, effect: {url: "http://down/effects", result_id_header: X-Result-Id}}`
	cases := []struct{ name, route, want string }{
		{"unknown shape", `{name: orders, broker: pubsub, auth: none, shape: sometimes, effect: {url: "http://d/e"}}`, `route "orders": shape "sometimes" is not one of handoff, idempotent`},
		{"unknown broker", `{name: orders, broker: kafka, auth: none, shape: unsafe, effect: {url: "http://d/e"}}`, `broker "kafka" is not one of pubsub, sns`},
		{"no auth", `{name: orders, broker: pubsub, shape: unsafe, effect: {url: "http://d/e"}}`, `route "orders": auth is required`},
		{"no shape", `{name: orders, broker: pubsub, auth: none, effect: {url: "http://d/e"}}`, `route "orders": shape is required`},
		{"misspelt field", `{name: orders, broker: pubsub, auth: none, shape: unsafe, efect: {url: "http://d/e"}}`, `route "orders": unknown field "efect"`},
		{"misspelt nested field", `{name: orders, broker: pubsub, auth: none, shape: unsafe, effect: {url: "http://d/e", timout: 5s}}`, `unknown field effect.timout`},
		{"unknown body mode", `{name: orders, broker: pubsub, auth: none, shape: unsafe, effect: {url: "http://d/e", body_mode: xml}}`, `effect.body_mode "xml" is not one of`},
		{"unknown key kind", `{name: orders, broker: pubsub, auth: none, shape: unsafe, operation_key: {kind: uuid}, effect: {url: "http://d/e"}}`, `operation_key.kind "uuid"`},
		{"no effect", `{name: orders, broker: pubsub, auth: none, shape: unsafe}`, `shape unsafe needs effect.url`},
		{"local without a statement", `{name: orders, broker: pubsub, auth: none, shape: local}`, `shape local needs local.sql`},
		{"bad name", `{name: Orders!, broker: pubsub, auth: none, shape: unsafe, effect: {url: "http://d/e"}}`, `name "Orders!"`},
		{"a section that is not a mapping", `{name: orders, broker: pubsub, auth: none, shape: unsafe, effect: "http://d/e"}`, `effect must be a mapping`},
		// The values schema refuses it first in the routes list.
		{"not a mapping", `orders`, `a route is a mapping|at '/routes/0': got string, want object`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			for _, vals := range []string{
				"routes: [" + c.route + "]",
				"routesFile: |\n  routes:\n    - " + good + "\n    - " + c.route + "\n",
			} {
				v := values(t, minimal, vals)
				_, err := render(t, v)
				if err == nil {
					t.Fatalf("rendered with %s", vals)
				}
				if !slices.ContainsFunc(strings.Split(c.want, "|"), func(w string) bool { return strings.Contains(err.Error(), w) }) {
					t.Errorf("%s:\nerror %v\nwant it to say %s", vals, err, c.want)
				}
			}
		})
	}
	for _, c := range []struct{ name, vals, want string }{
		{"duplicate names", "routes: [" + good + ", " + good + "]", `route "first": the name is used by another route`},
		{"routesFile not YAML", "routesFile: 'routes: [unclosed'", "routesFile: not a YAML document"},
		{"routesFile with another key", "routesFile: 'rutes: []'", `routesFile: unknown top-level key "rutes"`},
		{"routesFile routes not a list", "routesFile: 'routes: {name: orders}'", "routesFile: routes must be a list"},
	} {
		if _, err := render(t, values(t, minimal, c.vals)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error saying %s", c.name, err, c.want)
		}
	}
	// The same route, valid, renders both ways; so do the example routes.
	mustRender(t, values(t, minimal, "routes: ["+good+"]"))
	mustRender(t, values(t, minimal, "routesFile: |\n  routes:\n    - "+good+"\n"))
	mustRender(t, values(t, minimal, "routesFile: |\n"+indent(exampleRoutes(t), "  ")))
}
