package console

import "testing"

func TestCheckTraceURL(t *testing.T) {
	t.Parallel()
	for tmpl, ok := range map[string]bool{
		"": true, "https://t.example/trace/{trace_id}": true, "http://t.example/?q={trace_id}&x=1": true,
		"https://t.example/trace/": false, "javascript:{trace_id}": false, "/trace/{trace_id}": false,
	} {
		if err := CheckTraceURL(tmpl); (err == nil) != ok {
			t.Errorf("%q: %v", tmpl, err)
		}
	}
}
