package main

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestCheckIsHealthyOnlyOnTheExpectedAnswer(t *testing.T) {
	var status atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			time.Sleep(300 * time.Millisecond)
		}
		w.WriteHeader(int(status.Load()))
		_, _ = w.Write([]byte(`{"database":"connection refused"}`))
	}))
	defer srv.Close()
	for _, c := range []struct {
		name      string
		status    int
		path      string
		anyStatus bool
		wantErr   string
	}{
		{"ready", 200, "/readyz", false, ""},
		{"not ready names the cause", 503, "/readyz", false, "503 Service Unavailable {\"database\":\"connection refused\"}"},
		{"401 is up for -any", 401, "/", true, ""},
		{"404 is not ready without -any", 404, "/", false, "404"},
		{"500 is never healthy", 500, "/", true, "500"},
		{"too slow", 200, "/slow", false, "deadline exceeded"},
	} {
		t.Run(c.name, func(t *testing.T) {
			status.Store(int32(c.status))
			err := check(srv.URL+c.path, 100*time.Millisecond, c.anyStatus)
			if c.wantErr == "" && err != nil || c.wantErr != "" && (err == nil || !strings.Contains(err.Error(), c.wantErr)) {
				t.Errorf("check = %v, want error containing %q", err, c.wantErr)
			}
		})
	}
	if err := check("http://127.0.0.1:1/readyz", time.Second, true); err == nil {
		t.Error("nothing listening: healthy")
	}
}
