package deploy_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/compose-spec/compose-go/v2/types"

	"github.com/effectively-once/payments-cashback/deploy"
	"github.com/effectively-once/payments-cashback/pkg/service"
)

func TestComposeFileBuildsChecksHealthAndStartsInOrder(t *testing.T) {
	p, err := deploy.LoadCompose(context.Background(), "../docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	for _, err := range deploy.CheckCompose(p, "..") {
		t.Error(err)
	}

	// The whole stack on the default ports of docs/design.md ("Ports and the local stack").
	want := map[string]string{"postgres": "5432", "localstack": "4566", "stripe-mock": "12111", "smsprovider": "8090",
		"payments": "8081", "rewards": "8082", "notifications": "8083", "jaeger": "16686"}
	for name, port := range want {
		svc, ok := p.Services[name]
		if !ok {
			t.Errorf("no service %s", name)
			continue
		}
		if !slices.ContainsFunc(svc.Ports, func(pc types.ServicePortConfig) bool { return pc.Published == port }) {
			t.Errorf("service %s does not publish port %s", name, port)
		}
	}
	// The demo publishes its ports on the host's loopback only: PostgreSQL
	// with the password "postgres", the demo keys and stripe-mock are not
	// for the host's network.
	for name, svc := range p.Services {
		for _, pc := range svc.Ports {
			if pc.HostIP != "127.0.0.1" {
				t.Errorf("service %s publishes port %s on %q, want 127.0.0.1 only", name, pc.Published, pc.HostIP)
			}
		}
	}
	for _, name := range []string{"payments", "rewards", "notifications"} {
		svc := p.Services[name]
		for _, dep := range []string{"postgres", "localstack"} {
			if _, ok := svc.DependsOn[dep]; !ok {
				t.Errorf("%s does not wait for %s", name, dep)
			}
		}
		env := svc.Environment
		if v := env["AWS_ENDPOINT_URL"]; v == nil || *v != "http://localstack:4566" {
			t.Errorf("%s: AWS_ENDPOINT_URL = %v, want http://localstack:4566", name, v)
		}
		if v := env["OTEL_EXPORTER_OTLP_ENDPOINT"]; v == nil || !strings.Contains(*v, "jaeger:4318") {
			t.Errorf("%s: OTEL_EXPORTER_OTLP_ENDPOINT = %v, want Jaeger's OTLP/HTTP port", name, v)
		}
		// Docker's default 10 s would SIGKILL a drain the service allows 30 s.
		if g := svc.StopGracePeriod; g == nil || time.Duration(*g) <= 30*time.Second {
			t.Errorf("%s: stop_grace_period %v, want more than the services' 30 s shutdown deadline", name, g)
		}
	}
	// Containers bind every interface of their own network namespace, and
	// each service knows its clients (it would not start otherwise).
	for name, keys := range map[string]string{"payments": "PAYMENTS_API_KEYS", "rewards": "REWARDS_API_KEYS",
		"notifications": "NOTIFICATIONS_API_KEYS", "smsprovider": "SMS_PROVIDER_API_KEYS"} {
		env := p.Services[name].Environment
		if v := env["LISTEN_ADDR"]; v == nil || *v != "0.0.0.0" {
			t.Errorf("%s: LISTEN_ADDR = %v, want 0.0.0.0 inside compose", name, v)
		}
		if v := env[keys]; v == nil || *v == "" {
			t.Errorf("%s: no %s", name, keys)
		}
	}
	if v := p.Services["smsprovider"].Environment["SMS_PROVIDER_ALLOW_REMOTE"]; v == nil || *v != "true" {
		t.Errorf("smsprovider: SMS_PROVIDER_ALLOW_REMOTE = %v, want true (it refuses 0.0.0.0 otherwise)", v)
	}
	if _, ok := p.Services["notifications"].DependsOn["smsprovider"]; !ok {
		t.Error("notifications does not wait for the SMS provider")
	}
	// The provider's sender API wants a key with the role send: the one
	// notifications sends must be among the provider's clients with it.
	if v, ks := p.Services["notifications"].Environment["SMS_PROVIDER_API_KEY"], p.Services["smsprovider"].Environment["SMS_PROVIDER_API_KEYS"]; v == nil || ks == nil {
		t.Error("notifications has no SMS_PROVIDER_API_KEY, or the provider no SMS_PROVIDER_API_KEYS")
	} else if keys, err := service.ParseAPIKeys(*ks, service.RoleRead); err != nil {
		t.Errorf("smsprovider: SMS_PROVIDER_API_KEYS: %v", err)
	} else {
		send := service.RequireAPIKey(keys)(service.RequireRole(service.RoleSend)(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})))
		req := httptest.NewRequest(http.MethodPost, "/v1/messages", nil)
		req.Header.Set("Authorization", "Bearer "+*v)
		rec := httptest.NewRecorder()
		if send.ServeHTTP(rec, req); rec.Code != http.StatusOK {
			t.Errorf("notifications' SMS_PROVIDER_API_KEY at the provider's sender API: %d %s, want a key with the role send", rec.Code, rec.Body)
		}
	}
	if _, ok := p.Services["payments"].DependsOn["stripe-mock"]; !ok {
		t.Error("payments does not wait for stripe-mock")
	}
}

func TestLocalStackInitCreatesExactlyTheQueuesOfTheDesignWithTheirDLQs(t *testing.T) {
	b, err := os.ReadFile("../localstack/init/ready.d/10-queues.sh")
	if err != nil {
		t.Fatal(err)
	}
	script := string(b)
	m := regexp.MustCompile(`(?m)^for q in ([^;]+);`).FindStringSubmatch(script)
	if m == nil || strings.Join(strings.Fields(m[1]), " ") != "payments-events rewards-events" {
		t.Fatalf("the init script's queue loop is %q, want payments-events rewards-events", m)
	}
	for _, need := range []string{`--queue-name "${q}-dlq"`, `RedrivePolicy`, `MAX_RECEIVE_COUNT:-5`, `maxReceiveCount`} {
		if !strings.Contains(script, need) {
			t.Errorf("init script lacks %s", need)
		}
	}
}

func TestCheckComposeReportsEachBrokenRule(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "compose.yml")
	broken := `
services:
  db:
    image: postgres:15
  nohealth:
    image: busybox
    depends_on: [db]
  started:
    image: busybox
    healthcheck: { test: ["CMD", "true"] }
    depends_on:
      db: { condition: service_started }
  disabled:
    image: busybox
    healthcheck: { disable: true }
  badarg:
    build: { context: ., args: { SERVICE: ./no/such/package } }
    healthcheck: { test: ["CMD", "true"] }
`
	if err := os.WriteFile(path, []byte(broken), 0o644); err != nil {
		t.Fatal(err)
	}
	p, err := deploy.LoadCompose(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, err := range deploy.CheckCompose(p, "..") {
		got = append(got, err.Error())
	}
	want := []string{
		`service badarg: build arg SERVICE: "./no/such/package": no main package in ` + filepath.Join("..", "no", "such", "package"),
		"service db: has no healthcheck",
		"service disabled: has no healthcheck",
		"service nohealth: has no healthcheck",
		`service nohealth: depends on db with condition "service_started", want service_healthy`,
		`service started: depends on db with condition "service_started", want service_healthy`,
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("CheckCompose reported\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
