package service_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/go-chi/chi/v5"

	"github.com/effectively-once/payments-cashback/pkg/service"
)

// IDParam is the path segment as the client meant it: chi routes on the
// escaped path, so a URL encoder's %40 for '@' reached handlers as "%40"
// and the id allowlist refused a valid id. A segment that unescapes to
// no valid id is "".
func TestIDParamIsTheUnescapedIDOrNothing(t *testing.T) {
	r := chi.NewRouter()
	var got string
	r.Get("/things/{id}", func(w http.ResponseWriter, r *http.Request) { got = service.IDParam(r, "id") })
	for path, want := range map[string]string{
		"/things/alice@example":   "alice@example",
		"/things/alice%40example": "alice@example",
		"/things/%61%3Ab":         "a:b",
		"/things/a%2Fb":           "",
		"/things/a%00":            "",
		"/things/%FF":             "",
		"/things/a%20b":           "",
	} {
		got = "unset"
		r.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, path, nil))
		if got != want {
			t.Errorf("%s: IDParam %q, want %q", path, got, want)
		}
	}
}
