//go:build !e2e

package main

import (
	"log/slog"

	"github.com/effectively-once/payments-cashback/services/rewards/app"
)

// testHooks arms nothing: a production build has no failure hook and reads
// no REWARDS_FAIL_* variable.
func testHooks(*app.Config, *slog.Logger) error { return nil }
