//go:build e2e

package main

import (
	"log/slog"

	"github.com/effectively-once/payments-cashback/pkg/service"
	"github.com/effectively-once/payments-cashback/services/rewards/app"
	"github.com/effectively-once/payments-cashback/services/rewards/cashback"
)

// hookEnv is the environment of the test hook, read only by e2e builds.
type hookEnv struct {
	FailEventIDs string `env:"REWARDS_FAIL_EVENT_IDS"`
	FailFirstN   string `env:"REWARDS_FAIL_FIRST_N"`
	SlowEventIDs string `env:"REWARDS_SLOW_EVENT_IDS"`
}

// testHooks arms the failure hook from REWARDS_FAIL_EVENT_IDS,
// REWARDS_FAIL_FIRST_N and REWARDS_SLOW_EVENT_IDS (see package cashback).
func testHooks(cfg *app.Config, log *slog.Logger) error {
	env, err := service.LoadConfig[hookEnv]()
	if err != nil {
		return err
	}
	h, err := cashback.ParseFailHook(env.FailEventIDs, env.FailFirstN)
	if err != nil {
		return err
	}
	if err := h.SetSlow(env.SlowEventIDs); err != nil {
		return err
	}
	if h.Armed() {
		log.Warn("test hook armed: handling of some payment events will fail or stall on purpose",
			cashback.EnvFailEventIDs, env.FailEventIDs, cashback.EnvFailFirstN, env.FailFirstN,
			cashback.EnvSlowEventIDs, env.SlowEventIDs)
		cfg.Fail = h
	}
	return nil
}
