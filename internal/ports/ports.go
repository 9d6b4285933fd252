// Package ports finds a free loopback TCP port for a server a test or the
// local stack is about to start.
package ports

import (
	"errors"
	"math/rand/v2"
	"net"
	"strconv"
)

// Below Linux's default ephemeral range (32768–60999): a port the kernel
// hands to a connection or to a listener on ":0" never comes from here, so
// between Free and the server's own bind only another explicit chooser can
// take it (scripts/stack.sh picks from the same range).
const lo, hi = 20000, 32000

// Free returns a port on 127.0.0.1 that nothing listened on a moment ago.
func Free() (int, error) {
	for range 100 {
		p := lo + rand.IntN(hi-lo)
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err != nil {
			continue
		}
		_ = l.Close()
		return p, nil
	}
	return 0, errors.New("no free port in 20000-32000 on 127.0.0.1")
}
