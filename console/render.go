package console

import (
	"bytes"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// page is one page's template set: the layout and the page's own file.
type page struct{ t *template.Template }

var pageFiles = []string{"login.html", "lanes.html", "outbox.html", "routes.html", "operation.html", "error.html",
	"search.html", "poison.html"}

func parsePages() (map[string]*page, error) {
	out := make(map[string]*page, len(pageFiles))
	for _, name := range pageFiles {
		t, err := template.New("layout.html").Funcs(funcs).ParseFS(templateFS, "templates/layout.html", "templates/"+name)
		if err != nil {
			return nil, fmt.Errorf("console: template %s: %w", name, err)
		}
		out[name] = &page{t: t}
	}
	return out, nil
}

// view is what every page gets: its own data, and the session's name and
// CSRF token for the header's logout form (empty before login).
type view struct {
	Name string
	CSRF string
	Data any
}

// render writes a page whole or, when its template fails, a plain 500:
// a half-written page could show an operator a partial record as if it
// were all of it.
func (c *Console) render(w http.ResponseWriter, r *http.Request, status int, name string, data any) {
	v := view{Data: data}
	if s := sessionFrom(r.Context()); s.ID != "" {
		v.Name, v.CSRF = s.Name, s.CSRF
	}
	var b bytes.Buffer
	if err := c.pages[name].t.Execute(&b, v); err != nil {
		c.o.Logger.ErrorContext(r.Context(), "console page failed", "page", name, "err", err)
		http.Error(w, "the page could not be drawn", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = b.WriteTo(w)
}

var funcs = template.FuncMap{
	"ts": func(t any) string {
		switch v := t.(type) {
		case time.Time:
			if v.IsZero() {
				return "—"
			}
			return v.UTC().Format("2006-01-02 15:04:05.000Z")
		case *time.Time:
			if v == nil || v.IsZero() {
				return "—"
			}
			return v.UTC().Format("2006-01-02 15:04:05.000Z")
		}
		return "—"
	},
	"short": func(s string, n int) string {
		if len(s) <= n {
			return s
		}
		return s[:n] + "…"
	},
	"query": func(kv ...string) string {
		q := url.Values{}
		for i := 0; i+1 < len(kv); i += 2 {
			if kv[i+1] != "" {
				q.Set(kv[i], kv[i+1])
			}
		}
		return q.Encode()
	},
	"pathEscape": url.PathEscape,
	"label":      func(s string) string { return strings.ReplaceAll(s, "_", " ") },
}

// age is how long ago t was, to the second, in the largest two units.
func age(now, t time.Time) string {
	d := now.Sub(t).Truncate(time.Second)
	if d < 0 {
		d = 0
	}
	days := d / (24 * time.Hour)
	d -= days * 24 * time.Hour
	h := d / time.Hour
	d -= h * time.Hour
	m := d / time.Minute
	s := (d - m*time.Minute) / time.Second
	switch {
	case days > 0:
		return fmt.Sprintf("%dd %dh", days, h)
	case h > 0:
		return fmt.Sprintf("%dh %dm", h, m)
	case m > 0:
		return fmt.Sprintf("%dm %ds", m, s)
	}
	return fmt.Sprintf("%ds", s)
}

type errorPage struct {
	Title   string
	Message string
}

type loginPage struct {
	Nonce   string
	Problem string
}
