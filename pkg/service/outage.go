package service

import (
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/effectively-once/payments-cashback/pkg/outage"
)

// DatabaseGate is the outage gate of a consumer whose handlers write to
// pool: it probes with a ping. Set it as SubscriberConfig.Gate and add its
// Check to readiness as "consumer", so that while the database is away the
// subscriber stops receiving (nothing is dead-lettered for an outage) and
// the service says why it is not ready.
func DatabaseGate(pool *pgxpool.Pool, log *slog.Logger) (*outage.Gate, error) {
	return outage.NewGate(outage.GateConfig{Name: "database", Probe: pool.Ping, Logger: log})
}
