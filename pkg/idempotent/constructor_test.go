package idempotent_test

import (
	"strings"
	"testing"

	"github.com/effectively-once/payments-cashback/pkg/idempotent"
)

// Each constructor refuses a nil pool when it is called, instead of leaving
// a nil-pointer panic for the first message (or, for the Maintainer, at
// once, with no error).
func TestConstructorsRefuseANilPool(t *testing.T) {
	t.Parallel()
	for name, build := range map[string]func() (any, error){
		"NewConsumer":   func() (any, error) { return idempotent.NewConsumer(nil, "rewards") },
		"NewInbox":      func() (any, error) { return idempotent.NewInbox(nil, "notifications", idempotent.InboxConfig{}) },
		"NewMaintainer": func() (any, error) { return idempotent.NewMaintainer(nil, idempotent.MaintainerConfig{}) },
	} {
		if _, err := build(); err == nil || !strings.Contains(err.Error(), name+" needs a pool") {
			t.Errorf("%s(nil): %v; want an error saying it needs a pool", name, err)
		}
	}
}
