package testenv

import (
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sync"
	"syscall"
	"testing"
	"time"
)

// stripe-mock

var stripe struct {
	once sync.Once
	url  string
	proc *child // non-nil if we started stripe-mock
	err  error
}

// StripeMock returns the base URL of a stripe-mock server for tests: STRIPE_URL
// from the environment or .stack/env if set (it must be a loopback address:
// tests never talk to the real Stripe API), else a stripe-mock started from
// .tools/bin/stripe-mock once per test process, on a port the kernel picks,
// and stopped when Main returns (or when the test process dies).
//
// stripe-mock is stateless: it validates each request against Stripe's
// OpenAPI spec and answers with a fixture, echoing the Idempotency-Key header
// but returning a new object on every call. Tests that need to count charges
// put a recording proxy in front of it.
func StripeMock(t testing.TB) string {
	t.Helper()
	stripe.once.Do(setupStripeMock)
	if stripe.err != nil {
		t.Fatalf("testenv: %v", stripe.err)
	}
	return stripe.url
}

func setupStripeMock() {
	if u, from := lookup("STRIPE_URL"); u != "" {
		if err := requireLoopback(u); err != nil {
			stripe.err = fmt.Errorf("STRIPE_URL %q (from %s): %w: tests never talk to the real Stripe API", u, from, err)
			return
		}
		stripe.url = u
		return
	}
	proc, u, err := startStripeMock()
	if err != nil {
		stripe.err = err
		return
	}
	stripe.proc, stripe.url = proc, u
}

// stripe-mock prints "Listening for HTTP at address: 127.0.0.1:NNNNN" once
// it is bound; binding port 0 and reading the address back avoids racing
// another process for a "free" port.
var stripeListening = regexp.MustCompile(`Listening for HTTP at address: (\S+)`)

func startStripeMock() (*child, string, error) {
	root, err := repoRoot()
	if err != nil {
		return nil, "", fmt.Errorf("no stripe-mock: set STRIPE_URL (%v)", err)
	}
	bin := filepath.Join(root, ".tools", "bin", "stripe-mock")
	if _, err := os.Stat(bin); err != nil {
		return nil, "", fmt.Errorf("no stripe-mock: %s is missing and STRIPE_URL is unset\n"+
			"\tfix: install it (GOBIN=%s go install github.com/stripe/stripe-mock@v0.203.0), "+
			"or run one and set STRIPE_URL=http://127.0.0.1:12111", bin, filepath.Dir(bin))
	}
	attr, err := childAttr(false, syscall.SIGKILL)
	if err != nil {
		return nil, "", err
	}
	out := &Buffer{}
	// Both listeners on loopback, port chosen by the kernel: by default
	// stripe-mock also opens HTTPS on :12112 of every interface.
	cmd := exec.Command(bin, "-http-addr", "127.0.0.1:0", "-https-addr", "127.0.0.1:0")
	cmd.Stdout, cmd.Stderr, cmd.SysProcAttr = out, out, attr
	proc, err := startChild(cmd)
	if err != nil {
		return nil, "", fmt.Errorf("start stripe-mock: %w", err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		if m := stripeListening.FindStringSubmatch(out.String()); m != nil {
			u := "http://" + m[1]
			if err := pingStripeMock(u); err == nil {
				return proc, u, nil
			}
		}
		select {
		case <-proc.done:
			return nil, "", fmt.Errorf("stripe-mock exited on start:\n%s", out.String())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			proc.stop(os.Kill, 0)
			return nil, "", fmt.Errorf("stripe-mock not listening after 20s:\n%s", out.String())
		}
	}
}

func pingStripeMock(u string) error {
	req, err := http.NewRequest(http.MethodGet, u+"/v1/balance", nil)
	if err != nil {
		return err
	}
	req.SetBasicAuth("sk_test_123", "")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return errors.New(resp.Status)
	}
	return nil
}

func stopStripeMock() {
	if stripe.proc != nil {
		stripe.proc.stop(os.Kill, 0)
	}
}
