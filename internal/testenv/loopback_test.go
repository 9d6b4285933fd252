package testenv

import (
	"net"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"
)

// otherAddress is an address of this machine that is not loopback, or ""
// when it has none.
func otherAddress() string {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return ""
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && !n.IP.IsLoopback() && n.IP.To4() != nil {
			return n.IP.String()
		}
	}
	return ""
}

// reachableFrom reports whether something accepts connections on port at
// the machine's non-loopback address ip.
func reachableFrom(ip, port string) bool {
	c, err := net.DialTimeout("tcp", net.JoinHostPort(ip, port), time.Second)
	if err == nil {
		c.Close()
	}
	return err == nil
}

// The servers of the local stack, and the SQS server testenv starts itself,
// bind 127.0.0.1: nobody else on the network may put messages on the
// queues (a forged PaymentSucceeded would be credited) or read them.
// fauxqs listens on every interface unless its launcher stops it.
func TestTheLocalServersListenOnLoopbackOnly(t *testing.T) {
	ip := otherAddress()
	if ip == "" {
		t.Skip("this machine has no non-loopback address to try a connection from")
	}
	proc, endpoint, err := startFauxqs()
	if err != nil {
		t.Skipf("fauxqs not installed here (%v); the stack's servers below are checked by make test", err)
	}
	defer proc.stop(os.Interrupt, 5*time.Second)
	servers := map[string]string{"fauxqs started by testenv": endpoint}
	// Not DATABASE_URL: a server the caller names is theirs, and the
	// stack's own cluster is started with listen_addresses=127.0.0.1.
	for _, v := range []string{"AWS_ENDPOINT_URL", "MOTO_ENDPOINT_URL", "STRIPE_URL"} {
		if s := os.Getenv(v); s != "" {
			servers[v] = s
		}
	}
	for name, s := range servers {
		u, err := url.Parse(s)
		if err != nil || u.Port() == "" {
			t.Errorf("%s=%q: no port", name, s)
			continue
		}
		if !strings.HasPrefix(u.Hostname(), "127.") && u.Hostname() != "localhost" {
			continue // a server this machine was given, not one the stack started
		}
		if reachableFrom(ip, u.Port()) {
			t.Errorf("%s (%s) accepts connections on %s:%s: it must bind 127.0.0.1 only", name, s, ip, u.Port())
		}
	}
}
