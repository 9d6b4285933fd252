package testenv

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/jackc/pgx/v5"

	"github.com/effectively-once/payments-cashback/pkg/sqstransport"
)

func TestMain(m *testing.M) { Main(m) }

func TestDBRoundTrip(t *testing.T) {
	ctx := context.Background()
	db := DB(t)
	if _, err := db.Exec(ctx, `CREATE TABLE wallets (user_id text PRIMARY KEY, balance_paise bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(ctx, `INSERT INTO wallets VALUES ('u_17', 2400)`); err != nil {
		t.Fatal(err)
	}
	var balance int64
	if err := db.QueryRow(ctx, `SELECT balance_paise FROM wallets WHERE user_id = 'u_17'`).Scan(&balance); err != nil {
		t.Fatal(err)
	}
	if balance != 2400 {
		t.Fatalf("balance = %d, want 2400", balance)
	}
	var name string
	if err := db.QueryRow(ctx, `SELECT current_database()`).Scan(&name); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(name, "t_") {
		t.Errorf("database %q, want a t_<random> name", name)
	}
}

// Each call gets its own database, including from parallel tests (which
// also exercises concurrent CREATE DATABASE), and it is gone afterwards.
func TestDBIsolatedAndDropped(t *testing.T) {
	ctx := context.Background()
	names := make(chan string, 4)
	t.Run("group", func(t *testing.T) {
		for i := range 4 {
			t.Run(fmt.Sprint(i), func(t *testing.T) {
				t.Parallel()
				db := DB(t)
				var n string
				if err := db.QueryRow(ctx, `SELECT current_database()`).Scan(&n); err != nil {
					t.Fatal(err)
				}
				// An empty database: nothing leaks in from the others.
				var tables int
				if err := db.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE schemaname = 'public'`).Scan(&tables); err != nil {
					t.Fatal(err)
				}
				if tables != 0 {
					t.Errorf("fresh database has %d tables", tables)
				}
				if _, err := db.Exec(ctx, `CREATE TABLE mine (id int)`); err != nil {
					t.Fatal(err)
				}
				names <- n
			})
		}
	})
	close(names)
	seen := map[string]bool{}
	for n := range names {
		seen[n] = true
	}
	if len(seen) != 4 {
		t.Fatalf("got %d distinct databases, want 4: %v", len(seen), seen)
	}
	// pg_database is a shared catalog: any database on the server sees it.
	db := DB(t)
	for n := range seen {
		var exists bool
		if err := db.QueryRow(ctx, `SELECT exists (SELECT 1 FROM pg_database WHERE datname = $1)`, n).Scan(&exists); err != nil {
			t.Fatal(err)
		}
		if exists {
			t.Errorf("database %s still exists after its test ended", n)
		}
	}
}

func TestDatabaseURLConnects(t *testing.T) {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, DatabaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx) // before the DROP in cleanup; FORCE would cope anyway
	var one int
	if err := conn.QueryRow(ctx, `SELECT 1`).Scan(&one); err != nil || one != 1 {
		t.Fatalf("SELECT 1 = %d, %v", one, err)
	}
}

func TestQueueSendReceive(t *testing.T) {
	ctx := context.Background()
	c := SQS(t)
	q, dlq := Queue(t, c, 5, 30*time.Second)
	if q == dlq || !strings.HasSuffix(dlq, "-dlq") {
		t.Fatalf("queue %q, dlq %q", q, dlq)
	}
	body := `{"event_id":"e-91","event_type":"PaymentSucceeded"}`
	if _, err := c.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: aws.String(q), MessageBody: aws.String(body)}); err != nil {
		t.Fatal(err)
	}
	out, err := c.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{
		QueueUrl: aws.String(q), MaxNumberOfMessages: 10, WaitTimeSeconds: 5,
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(out.Messages) != 1 || aws.ToString(out.Messages[0].Body) != body {
		t.Fatalf("received %+v, want the one message sent", out.Messages)
	}
	if _, err := c.DeleteMessage(ctx, &sqs.DeleteMessageInput{QueueUrl: aws.String(q), ReceiptHandle: out.Messages[0].ReceiptHandle}); err != nil {
		t.Fatal(err)
	}
}

func TestQueueDeletedAfterTest(t *testing.T) {
	c := SQS(t)
	var q, dlq string
	t.Run("use", func(t *testing.T) { q, dlq = Queue(t, c, 5, time.Second) })
	for _, u := range []string{q, dlq} {
		name := u[strings.LastIndex(u, "/")+1:]
		_, err := c.GetQueueUrl(context.Background(), &sqs.GetQueueUrlInput{QueueName: aws.String(name)})
		var gone *types.QueueDoesNotExist
		if !errors.As(err, &gone) {
			t.Errorf("queue %s after its test: err = %v, want QueueDoesNotExist", name, err)
		}
	}
}

func TestRequireDockerMatchesDockerAvailable(t *testing.T) {
	var skipped bool
	t.Run("require", func(t *testing.T) {
		defer func() { skipped = t.Skipped() }()
		RequireDocker(t)
	})
	if skipped == DockerAvailable() {
		t.Errorf("RequireDocker skipped = %v, but DockerAvailable = %v (%v)", skipped, DockerAvailable(), docker.err)
	}
}

func TestRequireLoopback(t *testing.T) {
	for ep, ok := range map[string]bool{
		"http://127.0.0.1:4566":               true,
		"http://localhost:4566":               true,
		"http://sqs.us-east-1.localhost:4566": true,
		"http://[::1]:4566":                   true,
		"https://sqs.us-east-1.amazonaws.com": false,
		"http://10.0.0.5:4566":                false,
		"localhost:4566":                      false, // no scheme: not a URL we can check
	} {
		if err := requireLoopback(ep); (err == nil) != ok {
			t.Errorf("requireLoopback(%q) = %v, want ok=%v", ep, err, ok)
		}
	}
}

func TestWithDatabase(t *testing.T) {
	for in, want := range map[string]string{
		"postgres://u:p%40ss@h:5432/postgres?sslmode=disable": "postgres://u:p%40ss@h:5432/t_x?sslmode=disable",
		"postgresql://h":                "postgresql://h/t_x",
		"host=h user=u dbname=postgres": "host=h user=u dbname=postgres dbname=t_x",
	} {
		got, err := withDatabase(in, "t_x")
		if err != nil || got != want {
			t.Errorf("withDatabase(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
}

// A moto server started here answers the SQS API: the second, independent
// SQS implementation the transport is checked against.
func TestMotoServesSQS(t *testing.T) {
	ep := MotoEndpoint(t)
	req, _ := http.NewRequest(http.MethodPost, ep+"/", strings.NewReader(`{"QueueName":"moto-probe"}`))
	req.Header.Set("Content-Type", "application/x-amz-json-1.0")
	req.Header.Set("X-Amz-Target", "AmazonSQS.CreateQueue")
	req.Header.Set("Authorization", "AWS4-HMAC-SHA256 Credential=test/20260101/us-east-1/sqs/aws4_request, SignedHeaders=host, Signature=x")
	r2, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Body.Close()
	b, _ := io.ReadAll(r2.Body)
	if r2.StatusCode != http.StatusOK || !strings.Contains(string(b), "moto-probe") {
		t.Fatalf("CreateQueue on moto: %d %s", r2.StatusCode, b)
	}
}

// SQS talks to the server SQS_SERVER names and no other: on moto its
// endpoint is MotoEndpoint's and answers moto's /moto-api/, on fauxqs it
// answers fauxqs's /health; and code under test that builds its own client
// from AWS_ENDPOINT_URL[_SQS] reaches the same server.
func TestSQSIsTheServerSQSServerNames(t *testing.T) {
	server, err := SQSServer()
	if err != nil {
		t.Fatal(err)
	}
	ep := SQSEndpoint(t)
	probe := map[string]string{"moto": "/moto-api/", "fauxqs": "/health"}[server]
	resp, err := http.Get(ep + probe)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("SQS_SERVER=%s, endpoint %s: GET %s = %d, want 200 (is it %s?)", server, ep, probe, resp.StatusCode, server)
	}
	if server == "moto" && ep != MotoEndpoint(t) {
		t.Errorf("SQS_SERVER=moto: SQS endpoint %s, MotoEndpoint %s", ep, MotoEndpoint(t))
	}
	c, err := sqstransport.NewClient(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	q, _ := Queue(t, SQS(t), 5, time.Second)
	name := q[strings.LastIndex(q, "/")+1:]
	if _, err := c.GetQueueUrl(context.Background(), &sqs.GetQueueUrlInput{QueueName: aws.String(name)}); err != nil {
		t.Errorf("a client from the environment does not see the queue SQS made: %v", err)
	}
}

// SQS_SERVER accepts fauxqs and moto, defaults to fauxqs, and rejects
// anything else by name rather than running on a server nobody asked for.
func TestSQSServerValues(t *testing.T) {
	for v, want := range map[string]string{"fauxqs": "fauxqs", "moto": "moto", "localstack": "", "Moto": ""} {
		t.Setenv("SQS_SERVER", v)
		got, err := SQSServer()
		if got != want || (want == "") != (err != nil) {
			t.Errorf("SQS_SERVER=%s: %q, %v; want %q", v, got, err, want)
		}
	}
}
