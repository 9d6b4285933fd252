// Command smsprovider is the development SMS provider (see package
// services/notifications/smsprovider): idempotency keys, lookup by key,
// fault injection and a list of what it delivered, all in memory.
//
//	SMS_PROVIDER_PORT=8090 go run ./services/notifications/cmd/smsprovider
package main

import (
	"context"

	"github.com/effectively-once/payments-cashback/pkg/service"
	"github.com/effectively-once/payments-cashback/services/notifications/smsprovider"
)

type config struct {
	Port string `env:"SMS_PROVIDER_PORT" envDefault:"8090"`
}

func main() {
	log := service.NewLogger("smsprovider")
	cfg, err := service.LoadConfig[config]()
	if err != nil {
		service.Fatal(log, "bad configuration", err)
	}
	service.LogConfig(log, cfg)
	if err := service.Run(context.Background(), log, service.HTTPTask(service.ListenAddr(cfg.Port), smsprovider.New(), log)); err != nil {
		service.Fatal(log, "stopped", err)
	}
}
