package testenv

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/effectively-once/payments-cashback/pkg/service"
)

// RoutingCase is a request the router answers rather than a route: a path
// no route has (404 not_found) or a method its route lacks (405
// method_not_allowed, with Allow listing the methods it has).
type RoutingCase struct {
	Method, Path string
	Status       int
	Code, Allow  string
}

// RoutingErrors sends each case to baseURL with auth as its Authorization
// header ("" for none) and checks the answer: the status, the code and a
// message in the JSON error shape (service.ErrorBody, application/json),
// and the Allow header.
func RoutingErrors(t *testing.T, baseURL, auth string, cases []RoutingCase) {
	t.Helper()
	for _, c := range cases {
		status, header, body := call(t, baseURL, Route{Method: c.Method, Path: c.Path}, auth)
		var b service.ErrorBody
		err := json.Unmarshal([]byte(body), &b)
		what := c.Method + " " + c.Path
		if status != c.Status || err != nil || b.Error.Code != c.Code || b.Error.Message == "" {
			t.Errorf("%s: %d %+v (%v), want %d %s with a message", what, status, b.Error, err, c.Status, c.Code)
		}
		if ct := header.Get("Content-Type"); ct != "application/json" {
			t.Errorf("%s: Content-Type %q, want application/json", what, ct)
		}
		if got := strings.Join(header.Values("Allow"), ", "); got != c.Allow {
			t.Errorf("%s: Allow %q, want %q", what, got, c.Allow)
		}
	}
}
