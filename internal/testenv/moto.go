package testenv

import (
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"
)

// moto is a second, independent implementation of the AWS APIs (SQS and
// DynamoDB among them), written in Python. Running the same tests on it and
// on fauxqs keeps behaviour that only one server has out of the code.
var mt struct {
	once     sync.Once
	endpoint string
	proc     *child // non-nil if we started moto
	err      error  // why there is no moto: the test is skipped with it
}

// MotoEndpoint returns the endpoint of a moto server: MOTO_ENDPOINT_URL
// (environment, then .stack/env) if set, else one started once per test
// process with `python3 -m moto.server` on a free loopback port and stopped
// by Main. A machine without moto skips the test with the reason; it never
// falls back to another server.
func MotoEndpoint(t testing.TB) string {
	t.Helper()
	mt.once.Do(setupMoto)
	if mt.err != nil {
		t.Skipf("moto unavailable: %v", mt.err)
	}
	return mt.endpoint
}

// MotoAvailable reports whether MotoEndpoint would return an endpoint, and
// if not, why.
func MotoAvailable() error {
	mt.once.Do(setupMoto)
	return mt.err
}

func setupMoto() {
	if ep, from := lookup("MOTO_ENDPOINT_URL"); ep != "" {
		if err := requireLoopback(ep); err != nil {
			mt.err = fmt.Errorf("MOTO_ENDPOINT_URL %q (from %s): %w", ep, from, err)
			return
		}
		mt.endpoint = ep
		return
	}
	proc, ep, err := StartMoto()
	if err != nil {
		mt.err = err
		return
	}
	mt.proc, mt.endpoint = proc.child, ep
}

// MotoProcess is a moto server started by StartMoto.
type MotoProcess struct{ *child }

// Stop ends the server (SIGTERM, then SIGKILL after a second).
func (p MotoProcess) Stop() { p.stop(syscall.SIGTERM, time.Second) }

// StartMoto starts `python3 -m moto.server -H 127.0.0.1 -p PORT` on a free
// port and waits until GET /moto-api/ answers (about 0.6 s). It fails, saying
// why, when python3 or its moto package is missing.
func StartMoto() (MotoProcess, string, error) {
	py, err := exec.LookPath("python3")
	if err != nil {
		return MotoProcess{}, "", errors.New("no python3 on PATH (moto runs on it: pip install 'moto[server]')")
	}
	if out, err := exec.Command(py, "-c", "import moto.server").CombinedOutput(); err != nil {
		return MotoProcess{}, "", fmt.Errorf("python3 cannot import moto.server (pip install 'moto[server]'): %v: %s", err, lastLine(out))
	}
	port, err := freePort()
	if err != nil {
		return MotoProcess{}, "", err
	}
	attr, err := childAttr(false, syscall.SIGKILL)
	if err != nil {
		return MotoProcess{}, "", err
	}
	out := &Buffer{}
	cmd := exec.Command(py, "-m", "moto.server", "-H", "127.0.0.1", "-p", strconv.Itoa(port))
	cmd.Stdout, cmd.Stderr, cmd.SysProcAttr = out, out, attr
	proc, err := startChild(cmd)
	if err != nil {
		return MotoProcess{}, "", fmt.Errorf("start moto: %w", err)
	}
	endpoint := fmt.Sprintf("http://127.0.0.1:%d", port)
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(endpoint + "/moto-api/")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return MotoProcess{proc}, endpoint, nil
			}
		}
		select {
		case <-proc.done:
			return MotoProcess{}, "", fmt.Errorf("moto exited on start:\n%s", out.String())
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			proc.stop(os.Kill, 0)
			return MotoProcess{}, "", fmt.Errorf("moto not ready after 30s:\n%s", out.String())
		}
	}
}

func lastLine(b []byte) string {
	s := string(b)
	for len(s) > 0 && (s[len(s)-1] == '\n' || s[len(s)-1] == '\r') {
		s = s[:len(s)-1]
	}
	for i := len(s) - 1; i >= 0; i-- {
		if s[i] == '\n' {
			return s[i+1:]
		}
	}
	return s
}
