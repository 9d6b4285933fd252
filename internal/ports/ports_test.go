package ports

import (
	"net"
	"strconv"
	"testing"
)

// Free gives a bindable port outside the kernel's ephemeral range, so a
// listener on ":0" elsewhere cannot be handed the same one.
func TestFreeIsBindableAndBelowTheEphemeralRange(t *testing.T) {
	for range 20 {
		p, err := Free()
		if err != nil {
			t.Fatal(err)
		}
		if p < lo || p >= hi {
			t.Fatalf("port %d outside [%d, %d)", p, lo, hi)
		}
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err != nil {
			t.Fatalf("port %d not bindable: %v", p, err)
		}
		l.Close()
	}
}
