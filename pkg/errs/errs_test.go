package errs_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/effectively-once/payments-cashback/pkg/errs"
)

// A value that cannot be encoded is a 500 "internal", not the promised
// status with an empty body: the status is written only once the body
// is known to encode.
func TestAValueThatCannotBeEncodedIsA500NotAnEmptySuccess(t *testing.T) {
	w := httptest.NewRecorder()
	errs.WriteJSON(w, http.StatusOK, map[string]any{"at": time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)})
	var b errs.Body
	if err := json.Unmarshal(w.Body.Bytes(), &b); w.Code != http.StatusInternalServerError || err != nil || b.Error.Code != "internal" {
		t.Fatalf("got %d %q, want 500 internal", w.Code, w.Body.String())
	}
	w = httptest.NewRecorder()
	errs.WriteJSON(w, http.StatusCreated, map[string]int{"n": 1})
	if w.Code != http.StatusCreated || w.Body.String() != "{\"n\":1}\n" || w.Header().Get("Content-Type") != "application/json" {
		t.Fatalf("got %d %q %q, want 201 {\"n\":1}", w.Code, w.Body.String(), w.Header().Get("Content-Type"))
	}
}
