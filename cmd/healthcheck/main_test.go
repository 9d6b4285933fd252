package main

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// asCommandEnv makes the test binary run main with the arguments after
// "--": the command as Docker runs it, exit status included.
const asCommandEnv = "HEALTHCHECK_TEST_AS_COMMAND"

func TestMain(m *testing.M) {
	if os.Getenv(asCommandEnv) == "1" {
		for i, a := range os.Args {
			if a == "--" {
				os.Args = append([]string{"healthcheck"}, os.Args[i+1:]...)
				break
			}
		}
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// Docker reads a healthcheck's exit status 0 as healthy, 1 as unhealthy,
// and reserves every other: a usage error must exit 1 too, saying why.
func TestExitStatusIsZeroOrOne(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/readyz" {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	defer srv.Close()
	for _, c := range []struct {
		name     string
		args     []string
		want     int
		wantText string // in stderr
	}{
		{"healthy", []string{srv.URL + "/readyz"}, 0, ""},
		{"unhealthy", []string{srv.URL + "/other"}, 1, "unhealthy: "},
		{"no URL", nil, 1, "usage: healthcheck"},
		{"two URLs", []string{srv.URL, srv.URL}, 1, "usage: healthcheck"},
		{"unknown flag", []string{"-bogus", srv.URL + "/readyz"}, 1, "usage: healthcheck"},
		{"bad flag value", []string{"-timeout", "soon", srv.URL + "/readyz"}, 1, "usage: healthcheck"},
		{"help", []string{"-h"}, 1, "usage: healthcheck"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], append([]string{"-test.run=^$", "--"}, c.args...)...)
			cmd.Env = append(os.Environ(), asCommandEnv+"=1")
			var stderr strings.Builder
			cmd.Stderr = &stderr
			err := cmd.Run()
			got := 0
			var exit *exec.ExitError
			if errors.As(err, &exit) {
				got = exit.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			if got != c.want || !strings.Contains(stderr.String(), c.wantText) {
				t.Errorf("healthcheck %q: exit status %d, stderr %q; want %d and %q", c.args, got, stderr.String(), c.want, c.wantText)
			}
		})
	}
}

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
