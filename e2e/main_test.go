// Package e2e is the duplicate / redrive / race / crash suite: black-box
// tests against the running services, one Go test per scenario of the
// design, each asserting exact numbers from the service databases (read
// only), the queues and the dev SMS provider.
//
// They talk only through public surfaces: the HTTP APIs, the SQS API, the
// databases read-only, the services' /metrics and logs, and process control
// (start, SIGKILL, restart with test knobs) through internal/stack.
//
// Run them with `make e2e` (part of `make test`), or by hand:
//
//	scripts/stack.sh with go test -count=1 -v -timeout 20m ./e2e/
//
// E2E_STACK selects the services under test:
//
//	local (default)  TestMain builds and starts smsprovider, payments,
//	                 rewards and notifications (internal/stack) against the
//	                 infrastructure in .stack/env, and stops them at the end.
//	compose          the services of `docker compose up` (or any already
//	                 running ones) at the URLs in the environment; scenarios
//	                 that need process control or test knobs are skipped.
//
// SQS_SERVER=moto (environment or .stack/env) runs the suite on the stack's
// moto (MOTO_ENDPOINT_URL) instead of fauxqs; where the stack has none the
// suite skips itself, saying why.
//
// Without a stack (no .stack/env, as in a plain `go test ./...`) the suite
// skips itself. E2E_STORM_N sets the number of payments of the storm
// (default 1000); E2E_OUTAGE the length of scenario 17's outages (default
// 20s); SOAK_DURATION, SOAK_PAYMENTS, SOAK_SEED and SOAK_REPLICAS configure
// the chaos soak (TestChaosSoak, default 60s, 300 payments and 2 replicas of
// each process; make soak runs it for 10 minutes).
package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/effectively-once/payments-cashback/internal/stack"
	"github.com/effectively-once/payments-cashback/pkg/sqstransport"
)

// suite is what every scenario shares: one stack, one run id.
type suite struct {
	root  string
	env   map[string]string
	local *stack.Local // nil when the services are not ours (compose)

	paymentsURL, rewardsURL, notificationsURL, smsURL string

	payDB, rewDB, notDB *pgxpool.Pool // read-only
	sqs                 *sqs.Client
	payQ, payDLQ        string // queue URLs
	rewQ, rewDLQ        string

	apiKey string // the payments API's key for this suite (Authorization: Bearer)
	// keys are the other dev clients' keys, by stack.DevClients' KeyVar
	// (REWARDS_READ_KEY, REWARDS_ADMIN_KEY, NOTIFICATIONS_READ_KEY, ...).
	keys       map[string]string
	redriveBin string
	run        string // unique per suite run: user and payment ids carry it

	traces *collector // the spans the local stack's services export; nil for compose
}

var s suite

// ComposeAPIKey is the dev client's key in docker-compose.yml (a demo
// value, never a production one).
const ComposeAPIKey = "dev-compose-demo-key-0123456789abcdef"

// composeKeys are the other demo keys of docker-compose.yml.
var composeKeys = map[string]string{
	"REWARDS_READ_KEY":       "dev-compose-rewards-read-0123456789abcdef",
	"REWARDS_ADMIN_KEY":      "dev-compose-rewards-admin-0123456789abcdef",
	"NOTIFICATIONS_READ_KEY": "dev-compose-notifications-read-0123456789abcdef",
	"SMS_PROVIDER_READ_KEY":  "dev-compose-sms-read-0123456789abcdef",
	"SMS_PROVIDER_ADMIN_KEY": "dev-compose-sms-admin-0123456789abcdef",
	"SMS_PROVIDER_API_KEY":   "dev-compose-sms-send-0123456789abcdef",
}

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		fmt.Println("e2e: skipped with -short (the suite needs the running stack)")
		os.Exit(0)
	}
	code, err := setup(m)
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		os.Exit(1)
	}
	os.Exit(code)
}

func setup(m *testing.M) (code int, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	s.run = randomHex(4)
	if s.root, err = stack.RepoRoot(); err != nil {
		return 0, err
	}
	mode := os.Getenv("E2E_STACK")
	switch mode {
	case "", "local":
		if s.env, err = stack.LoadEnv(s.root); errors.Is(err, fs.ErrNotExist) {
			// A plain `go test ./...`: no infrastructure to run against.
			fmt.Printf("e2e: skipped: %v\n(make e2e and make test bring the stack up for it)\n", err)
			return 0, nil
		}
		if err != nil {
			return 0, err
		}
		if skip, err := chooseSQSServer(s.env); err != nil || skip != "" {
			if skip != "" {
				fmt.Printf("e2e: skipped: %s\n", skip)
			}
			return 0, err
		}
		// Short long polls and visibility timeouts for the consumers. A
		// consumer stopped during a long poll leaves that ReceiveMessage
		// pending on the server, which then hands the next message to the
		// dead connection: the message reappears only after its visibility
		// timeout (30 s by default; real SQS does the same). The suite
		// restarts consumers all the time; this bounds the cost to seconds.
		s.env["SUBSCRIBER_WAIT_TIME"] = "1s"
		s.env["SUBSCRIBER_VISIBILITY"] = "5s"
		// Every service exports its spans, over OTLP/HTTP as in production,
		// to a receiver in this process (the trace scenario reads them).
		if s.traces, err = startCollector(); err != nil {
			return 0, err
		}
		defer s.traces.close()
		s.env["OTEL_TRACES_EXPORTER"] = "otlp"
		s.env["OTEL_EXPORTER_OTLP_ENDPOINT"] = s.traces.url
		s.env["OTEL_BSP_SCHEDULE_DELAY"] = "200" // ms: spans arrive quickly
		// A new rate starts a second from now, not a minute: the rate
		// scenarios see it take effect without waiting.
		s.env["REWARDS_RATE_MIN_LEAD"] = "1s"
		// The logs of this run only: scenarios count log lines, and a
		// previous run's would be counted too.
		logDir := filepath.Join(s.root, ".stack", "logs", "e2e")
		if err := os.RemoveAll(logDir); err != nil {
			return 0, err
		}
		t0 := time.Now()
		s.local, err = stack.StartLocal(ctx, stack.Options{Root: s.root, Env: s.env,
			LogDir: logDir, Ready: time.Minute, Tags: []string{"e2e"}})
		var busy *stack.PortInUseError
		if errors.As(err, &busy) {
			return 0, fmt.Errorf("%w\n(to run the suite against services that are already up, set E2E_STACK=compose; "+
				"scenarios that need process control are then skipped)", err)
		}
		if err != nil {
			return 0, err
		}
		defer s.local.Close()
		fmt.Printf("e2e: local stack up in %v (logs in %s)\n", time.Since(t0).Round(time.Millisecond), filepath.Dir(s.local.LogPath("payments")))
		s.paymentsURL, s.rewardsURL = s.local.URL(stack.Payments), s.local.URL(stack.Rewards)
		s.apiKey = s.local.APIKey()
		s.keys = map[string]string{}
		for _, c := range stack.DevClients {
			s.keys[c.KeyVar] = s.local.Key(c.KeyVar)
		}
		s.notificationsURL, s.smsURL = s.local.URL(stack.Notifications), s.local.URL(stack.SMSProvider)
	case "compose", "external":
		// The services of docker-compose.yml, on their published ports.
		s.env = map[string]string{}
		for k, def := range map[string]string{
			"PAYMENTS_DATABASE_URL":      "postgres://postgres:postgres@127.0.0.1:5432/payments?sslmode=disable",
			"REWARDS_DATABASE_URL":       "postgres://postgres:postgres@127.0.0.1:5432/rewards?sslmode=disable",
			"NOTIFICATIONS_DATABASE_URL": "postgres://postgres:postgres@127.0.0.1:5432/notifications?sslmode=disable",
			"AWS_ENDPOINT_URL":           "http://127.0.0.1:4566",
			"PAYMENTS_URL":               "http://127.0.0.1:8081",
			"REWARDS_URL":                "http://127.0.0.1:8082",
			"NOTIFICATIONS_URL":          "http://127.0.0.1:8083",
			"SMS_PROVIDER_URL":           "http://127.0.0.1:8090",
			"PAYMENTS_API_KEY":           ComposeAPIKey,
		} {
			s.env[k] = def
			if v := os.Getenv(k); v != "" {
				s.env[k] = v
			}
		}
		s.paymentsURL, s.rewardsURL = s.env["PAYMENTS_URL"], s.env["REWARDS_URL"]
		s.apiKey = s.env["PAYMENTS_API_KEY"]
		s.keys = map[string]string{}
		for k, def := range composeKeys {
			s.keys[k] = def
			if v := os.Getenv(k); v != "" {
				s.keys[k] = v
			}
		}
		s.notificationsURL, s.smsURL = s.env["NOTIFICATIONS_URL"], s.env["SMS_PROVIDER_URL"]
		for _, u := range []string{s.paymentsURL, s.rewardsURL, s.notificationsURL} {
			if err := readyz(ctx, u+"/readyz"); err != nil {
				return 0, fmt.Errorf("E2E_STACK=%s: %w (is `docker compose up` running?)", mode, err)
			}
		}
		fmt.Printf("e2e: E2E_STACK=%s: using the running services; scenarios needing process control are skipped\n", mode)
	default:
		return 0, fmt.Errorf("E2E_STACK=%q: want local or compose", mode)
	}

	// The test process's own SQS client and the redrive command read the
	// standard AWS variables.
	for _, k := range []string{"AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_SQS", "AWS_REGION", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} {
		if v := s.env[k]; v != "" {
			os.Setenv(k, v)
		}
	}
	if os.Getenv("AWS_ACCESS_KEY_ID") == "" {
		os.Setenv("AWS_ACCESS_KEY_ID", "test")
		os.Setenv("AWS_SECRET_ACCESS_KEY", "test")
	}
	if os.Getenv("AWS_REGION") == "" {
		os.Setenv("AWS_REGION", "us-east-1")
	}
	if s.sqs, err = sqstransport.NewClient(ctx); err != nil {
		return 0, err
	}
	for _, q := range []struct {
		dst  *string
		name string
	}{{&s.payQ, "payments-events"}, {&s.payDLQ, "payments-events-dlq"}, {&s.rewQ, "rewards-events"}, {&s.rewDLQ, "rewards-events-dlq"}} {
		out, err := s.sqs.GetQueueUrl(ctx, &sqs.GetQueueUrlInput{QueueName: &q.name})
		if err != nil {
			return 0, fmt.Errorf("queue %s: %w", q.name, err)
		}
		*q.dst = *out.QueueUrl
	}
	for _, d := range []struct {
		dst **pgxpool.Pool
		key string
	}{{&s.payDB, "PAYMENTS_DATABASE_URL"}, {&s.rewDB, "REWARDS_DATABASE_URL"}, {&s.notDB, "NOTIFICATIONS_DATABASE_URL"}} {
		if *d.dst, err = readOnlyPool(ctx, s.env[d.key]); err != nil {
			return 0, fmt.Errorf("%s: %w", d.key, err)
		}
		defer (*d.dst).Close()
	}

	if err := storyRate(ctx); err != nil {
		return 0, err
	}

	// The project's own redrive command, built once.
	tmp, err := os.MkdirTemp("", "e2e-bin-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(tmp)
	s.redriveBin = filepath.Join(tmp, "redrive")
	build := exec.CommandContext(ctx, "go", "build", "-o", s.redriveBin, "./cmd/redrive")
	build.Dir = s.root
	if out, err := build.CombinedOutput(); err != nil {
		return 0, fmt.Errorf("go build ./cmd/redrive: %w\n%s", err, out)
	}

	t0 := time.Now()
	code = m.Run()
	fmt.Printf("e2e: scenarios took %v\n", time.Since(t0).Round(time.Millisecond))
	return code, nil
}

// chooseSQSServer points the suite and the services it starts at the SQS
// server SQS_SERVER names (environment, then .stack/env): fauxqs, the
// stack's AWS_ENDPOINT_URL, or moto, its MOTO_ENDPOINT_URL (scripts/stack.sh
// with SQS_SERVER=moto or WITH_MOTO=true). Where the stack has no moto it
// returns why, and the suite is skipped rather than run on another server.
func chooseSQSServer(env map[string]string) (skip string, err error) {
	server := os.Getenv("SQS_SERVER")
	if server == "" {
		server = env["SQS_SERVER"]
	}
	switch server {
	case "", "fauxqs":
		fmt.Printf("e2e: SQS server: fauxqs at %s\n", env["AWS_ENDPOINT_URL"])
		return "", nil
	case "moto":
		ep := env["MOTO_ENDPOINT_URL"]
		if ep == "" {
			why := env["MOTO_UNAVAILABLE"]
			if why == "" {
				why = "the stack in .stack/env has no moto (start it with SQS_SERVER=moto or WITH_MOTO=true)"
			}
			return "SQS_SERVER=moto, but " + why, nil
		}
		env["SQS_SERVER"] = "moto"
		env["AWS_ENDPOINT_URL"], env["AWS_ENDPOINT_URL_SQS"] = ep, ep
		fmt.Printf("e2e: SQS server: moto at %s\n", ep)
		return "", nil
	}
	return "", fmt.Errorf("SQS_SERVER=%q: want fauxqs or moto", server)
}

// readOnlyPool opens url with every transaction read only: the suite
// inspects the services' databases, it never writes to them.
func readOnlyPool(ctx context.Context, url string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	cfg.ConnConfig.RuntimeParams["default_transaction_read_only"] = "on"
	cfg.MaxConns = 8
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, err
	}
	return pool, nil
}

func readyz(ctx context.Context, url string) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("GET %s: %s", url, resp.Status)
		}
		if time.Now().After(deadline) {
			return err
		}
		time.Sleep(500 * time.Millisecond)
	}
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// storyRate makes sure the scenarios' 2% is the cashback rate, now and
// later: the data outlives the stack, so a rate changed by hand (README,
// "Trying it by hand") would otherwise fail every scenario's amount
// check. A rate other than 2% in force is put back through the API, when
// the services are ours (their REWARDS_RATE_MIN_LEAD is a second); one
// scheduled for later, or in force on compose, stops the suite here with
// what to do.
func storyRate(ctx context.Context) error {
	var inForce, laterOther int
	var later *time.Time
	if err := s.rewDB.QueryRow(ctx, `SELECT
		coalesce((SELECT rate_bp FROM cashback_rates WHERE effective_from <= now() ORDER BY effective_from DESC LIMIT 1), -1),
		(SELECT count(*) FROM cashback_rates WHERE effective_from > now() AND rate_bp <> $1),
		(SELECT max(effective_from) FROM cashback_rates WHERE effective_from > now() AND rate_bp <> $1)`, storyRateBP).
		Scan(&inForce, &laterOther, &later); err != nil {
		return fmt.Errorf("read rewards' cashback rates: %w", err)
	}
	const fix = "the scenarios expect 2%: `make clean` starts the local stack's data afresh"
	if laterOther > 0 {
		return fmt.Errorf("rewards has %d cashback rate(s) other than 2%% scheduled, the last at %v (a rate change made by hand?); %s, or wait until then and run again",
			laterOther, later.Format(time.RFC3339), fix)
	}
	if inForce == storyRateBP {
		return nil
	}
	if s.local == nil {
		return fmt.Errorf("the cashback rate in force is %d bp (a rate change made by hand?); %s, or POST {\"rate_bp\":%d} to /v1/cashback-rates and wait for it",
			inForce, fix, storyRateBP)
	}
	b, err := json.Marshal(map[string]int{"rate_bp": storyRateBP})
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.rewardsURL+"/v1/cashback-rates", bytes.NewReader(b))
	if err != nil {
		return err
	}
	authorize(req)
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("put the cashback rate back to 2%%: %w", err)
	}
	defer resp.Body.Close()
	var r rate
	if err := json.NewDecoder(resp.Body).Decode(&r); resp.StatusCode != http.StatusCreated || err != nil {
		return fmt.Errorf("put the cashback rate back to 2%%: %s", resp.Status)
	}
	fmt.Printf("e2e: the cashback rate in force was %d bp; 2%% again from %v\n", inForce, r.EffectiveFrom.Format(time.RFC3339Nano))
	time.Sleep(time.Until(r.EffectiveFrom) + 50*time.Millisecond) // the database's clock and ours
	return nil
}

// storyRateBP is the rate of the story (docs/design.md), which every
// scenario's amounts assume.
const storyRateBP = 200
