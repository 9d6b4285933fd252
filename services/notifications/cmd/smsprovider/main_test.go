package main

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/effectively-once/payments-cashback/pkg/service"
)

// The test double binds loopback by default and refuses any other address
// unless SMS_PROVIDER_ALLOW_REMOTE says so; without a reader's and an
// operator's key it does not start.
func TestTheTestDoubleBindsLoopbackAndRefusesARemoteAddressUnlessAllowed(t *testing.T) {
	keys := service.AccessEnv{APIKeys: "ops/read+admin:sms-admin-0123456789abcdef0123456789a,notifications/send:sms-send-0123456789abcdef0123456789ab",
		RateLimit: 10, AddressRateLimit: 10, RateWindow: time.Second}
	noSender := keys
	noSender.APIKeys = "ops/read+admin:sms-admin-0123456789abcdef0123456789a"
	for _, c := range []struct {
		cfg      config
		addr     string
		errorHas string
	}{
		{config{Port: "8090", Access: keys}, "127.0.0.1:8090", ""},
		{config{Port: "8090", ListenAddr: "localhost", Access: keys}, "localhost:8090", ""},
		{config{Port: "8090", ListenAddr: "0.0.0.0", Access: keys}, "", "not loopback"},
		{config{Port: ":8090", Access: keys}, "", "not loopback"},
		{config{Port: "8090", ListenAddr: "10.1.2.3", Access: keys}, "", "SMS_PROVIDER_ALLOW_REMOTE=true"},
		{config{Port: "8090", ListenAddr: "0.0.0.0", AllowRemote: true, Access: keys}, "0.0.0.0:8090", ""},
		{config{Port: "8090", Access: service.AccessEnv{RateLimit: 1, AddressRateLimit: 1, RateWindow: time.Second}}, "", "SMS_PROVIDER_API_KEYS is empty"},
		// No client may send: the notifications service would get 403 on every SMS.
		{config{Port: "8090", Access: noSender}, "", "role send"},
		// Its port is SMS_PROVIDER_PORT, not the services' PORT: the error names it.
		{config{Port: "80a", Access: keys}, "", `SMS_PROVIDER_PORT "80a"`},
	} {
		addr, _, err := build(c.cfg, slog.New(slog.DiscardHandler), nil)
		switch {
		case c.errorHas == "" && (err != nil || addr != c.addr):
			t.Errorf("%+v: %q, %v; want %s", c.cfg, addr, err, c.addr)
		case c.errorHas != "" && (err == nil || !strings.Contains(err.Error(), c.errorHas)):
			t.Errorf("%+v: %q, %v; want an error saying %q", c.cfg, addr, err, c.errorHas)
		}
	}
}

// PPROF_ADDR, which the test double reads as every service does, serves
// profiles as it does there: a task of its own, on a loopback address only.
func TestPprofAddrServesProfiles(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	var cfg config
	if ts, err := tasks(cfg, "127.0.0.1:8090", nil, log); err != nil || len(ts) != 1 {
		t.Fatalf("without PPROF_ADDR: %d tasks, %v; want the API only", len(ts), err)
	}
	cfg.PprofAddr = "127.0.0.1:6061"
	ts, err := tasks(cfg, "127.0.0.1:8090", nil, log)
	if err != nil || len(ts) != 2 || ts[1].Name != "pprof 127.0.0.1:6061" {
		t.Fatalf("with PPROF_ADDR: %+v, %v; want the API and pprof 127.0.0.1:6061", ts, err)
	}
	cfg.PprofAddr = "0.0.0.0:6061"
	if _, err := tasks(cfg, "127.0.0.1:8090", nil, log); err == nil {
		t.Error("a non-loopback PPROF_ADDR accepted")
	}
}
