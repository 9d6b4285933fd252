package service_test

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/effectively-once/payments-cashback/internal/testenv"
	"github.com/effectively-once/payments-cashback/pkg/service"
)

// The pool takes DB_MAX_CONNS (Process.DBMaxConns) as its size unless the
// URL names one itself, and pgx's default only when neither does.
func TestOpenPoolSizeComesFromTheURLElseFromDBMaxConns(t *testing.T) {
	url := testenv.DatabaseURL(t)
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, tc := range []struct {
		name     string
		url      string
		maxConns int32
		want     int32
	}{
		{"DB_MAX_CONNS", url, 10, 10},
		{"the URL's pool_max_conns wins", url + sep + "pool_max_conns=3", 10, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pool, err := service.OpenPool(context.Background(), tc.url, tc.maxConns, 10*time.Second, log)
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()
			if got := pool.Config().MaxConns; got != tc.want {
				t.Fatalf("MaxConns = %d, want %d", got, tc.want)
			}
		})
	}
	var p service.Process
	t.Setenv("DB_MAX_CONNS", "")
	cfg, err := service.LoadConfig[service.Process]()
	if err != nil {
		t.Fatal(err)
	}
	if p = cfg; p.DBMaxConns != 10 {
		t.Fatalf("DB_MAX_CONNS default = %d, want 10", p.DBMaxConns)
	}
}
