package outbox_test

import (
	"strings"
	"testing"

	"github.com/effectively-once/payments-cashback/pkg/outbox"
)

// A relay without its pool or its publisher is refused when it is built,
// not found out by a nil-pointer panic at its first claim.
func TestNewRelayNeedsAPoolAndAPublisher(t *testing.T) {
	pool := setup(t)
	_, _, pub := queue(t)
	for name, build := range map[string]func() (*outbox.Relay, error){
		"no pool":      func() (*outbox.Relay, error) { return outbox.NewRelay(nil, pub, outbox.RelayConfig{}) },
		"no publisher": func() (*outbox.Relay, error) { return outbox.NewRelay(pool, nil, outbox.RelayConfig{}) },
	} {
		if r, err := build(); r != nil || err == nil || !strings.Contains(err.Error(), "needs a pool and a publisher") {
			t.Errorf("%s: %v, %v; want no relay and an error saying what it needs", name, r, err)
		}
	}
}
