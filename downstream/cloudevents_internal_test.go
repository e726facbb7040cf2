package downstream

import (
	"crypto/sha256"
	"encoding/hex"
	"testing"
)

// The extension names are what the doc comment says, whatever the map's
// order: lower-cased letters and digits when that is unique, valid and
// short; the hash form otherwise, for every attribute that would share it.
func TestExtensionNames(t *testing.T) {
	t.Parallel()
	hash := func(name string) string {
		sum := sha256.Sum256([]byte(name))
		return "attr" + hex.EncodeToString(sum[:8])
	}
	attrs := map[string]string{
		"event_type": "", "eventType": "", "region": "", "Region-2": "",
		"googclient_traceparent": "", "source": "", "data_base64": "", "": "", "日本": "",
		"attr0123456789abcdef": "",
	}
	want := map[string]string{
		"event_type": hash("event_type"), "eventType": hash("eventType"), "region": "region", "Region-2": "region2",
		"googclient_traceparent": hash("googclient_traceparent"), "source": hash("source"),
		"data_base64": hash("data_base64"), "": hash(""), "日本": hash("日本"),
		"attr0123456789abcdef": hash("attr0123456789abcdef"),
	}
	for range 20 {
		got := extensionNames(attrs)
		for name, w := range want {
			if got[name] != w {
				t.Fatalf("%q -> %q, want %q", name, got[name], w)
			}
		}
	}
}
