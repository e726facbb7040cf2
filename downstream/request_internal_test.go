package downstream

import (
	"context"
	"net/http"
	"strings"
	"testing"
)

// TestEffectRequestIsNotReplayable pins the request shape the replay test
// depends on, so a change here fails with a reason rather than only with a
// count in TestExecuteNeverReplays.
func TestEffectRequestIsNotReplayable(t *testing.T) {
	t.Parallel()
	for _, body := range [][]byte{nil, {}, []byte("x")} {
		r, err := newEffectRequest(context.Background(), http.MethodPost, "http://example.test/", &newEffectCall(body).body)
		if err != nil {
			t.Fatal(err)
		}
		if r.GetBody != nil {
			t.Errorf("body %q: GetBody is set; the Transport could rewind and resend", body)
		}
		if r.Body == nil || r.Body == http.NoBody {
			t.Errorf("body %q: Body is %v; nil and NoBody count as replayable", body, r.Body)
		}
		if r.ContentLength != int64(len(body)) {
			t.Errorf("body %q: ContentLength %d", body, r.ContentLength)
		}
	}
}

func TestBoundKeepsRunesWhole(t *testing.T) {
	t.Parallel()
	s := strings.Repeat("a", maxReasonLen-1) + "é and more"
	got := bound(s)
	if len(got) != maxReasonLen-1 || got != strings.Repeat("a", maxReasonLen-1) {
		t.Errorf("bound cut %q to %d bytes %q", s, len(got), got[len(got)-3:])
	}
	if short := "short"; bound(short) != short {
		t.Errorf("bound changed a short reason")
	}
}
