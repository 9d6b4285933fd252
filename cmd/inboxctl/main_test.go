package main

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/effectively-once/payments-cashback/internal/testenv"
	"github.com/effectively-once/payments-cashback/pkg/events"
	"github.com/effectively-once/payments-cashback/pkg/idempotent"
	"github.com/effectively-once/payments-cashback/services/contract"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func inboxctl(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = run(context.Background(), args, &out, &errb)
	return code, out.String(), errb.String()
}

func event(t *testing.T, key string, version int64) events.Envelope {
	t.Helper()
	e, err := events.New(contract.CashbackCredited, key, version, map[string]int{"amount_paise": 2400})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// The three verbs against a real database: a poison row FAILED with its
// key's next row blocked behind it, one row DONE.
func TestCommands(t *testing.T) {
	dsn := testenv.DatabaseURL(t)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if err := idempotent.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	in, err := idempotent.NewInbox(pool, "notifications", idempotent.InboxConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	poison, blocked, ok := event(t, "cb_1", 1), event(t, "cb_1", 2), event(t, "cb_2", 1)
	for _, e := range []events.Envelope{poison, blocked, ok} {
		if _, err := in.Receive(ctx, e, e.AggregateID); err != nil {
			t.Fatal(err)
		}
	}
	p, err := in.NewProcessor(func(ctx context.Context, tx pgx.Tx, e events.Envelope) error {
		if e.EventID == poison.EventID {
			return idempotent.Permanent(errors.New("sms template\n'cashback_v2' missing"))
		}
		return nil
	}, idempotent.ProcessorConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.ProcessOnce(ctx); err != nil {
		t.Fatal(err)
	}

	code, out, errOut := inboxctl(t, "-database-url", dsn, "backlog")
	if code != 0 || !strings.Contains(out, "CONSUMER") || !tableHasLine(out, "notifications", "1", "1") {
		t.Fatalf("backlog: %d %q %q", code, out, errOut)
	}
	t.Logf("backlog:\n%s", out)

	code, out, errOut = inboxctl(t, "failed", "-database-url", dsn, "-consumer", "notifications")
	if code != 0 || !strings.Contains(out, poison.EventID.String()) || !strings.Contains(out, "sms template 'cashback_v2' missing") ||
		strings.Contains(out, ok.EventID.String()) {
		t.Fatalf("failed: %d %q %q", code, out, errOut)
	}
	if !tableHasLine(out, poison.EventID.String(), "cb_1", "1", "1", "1") { // version, attempts, blocked
		t.Fatalf("failed row line lacks version 1, attempts 1, blocked 1:\n%s", out)
	}
	t.Logf("failed:\n%s", out)

	for _, args := range [][]string{
		{"replay", "-consumer", "notifications"}, // names nothing
		{"replay", "-id", "not-a-uuid"},
		{"nonsense"},
		{"failed", "stray"},
	} {
		if code, _, _ := inboxctl(t, append([]string{"-database-url", dsn}, args...)...); code != 2 {
			t.Fatalf("%v: exit %d, want 2 (usage)", args, code)
		}
	}
	t.Setenv("DATABASE_URL", "")
	if code, _, errOut := inboxctl(t, "backlog"); code != 2 || !strings.Contains(errOut, "DATABASE_URL") {
		t.Fatalf("no database: %d %q", code, errOut)
	}

	code, out, _ = inboxctl(t, "-database-url", dsn, "replay", "-id", poison.EventID.String())
	if code != 0 || !strings.Contains(out, "replayed 1 row(s)") {
		t.Fatalf("replay: %d %q", code, out)
	}
	var status string
	var attempts int
	if err := pool.QueryRow(ctx, `SELECT status, attempts FROM inbox WHERE message_id = $1`, poison.EventID).Scan(&status, &attempts); err != nil {
		t.Fatal(err)
	}
	if status != "PENDING" || attempts != 0 {
		t.Fatalf("replayed row %s/%d, want PENDING/0", status, attempts)
	}
	code, out, _ = inboxctl(t, "-database-url", dsn, "replay", "-consumer", "notifications", "-all-failed")
	if code != 0 || !strings.Contains(out, "nothing replayed") {
		t.Fatalf("second replay: %d %q", code, out)
	}
	code, out, _ = inboxctl(t, "-database-url", dsn, "failed")
	if code != 0 || !strings.Contains(out, "no FAILED rows") {
		t.Fatalf("failed after replay: %d %q", code, out)
	}
}

// tableHasLine reports whether some row of a table has first as its first
// or second cell and holds the other fields, in order, as whole cells.
func tableHasLine(table, first string, fields ...string) bool {
	for _, line := range strings.Split(table, "\n") {
		cells := strings.Fields(line)
		if len(cells) == 0 || cells[0] != first && !(len(cells) > 1 && cells[1] == first) {
			continue
		}
		i := 0
		for _, c := range cells {
			if i < len(fields) && c == fields[i] {
				i++
			}
		}
		if i == len(fields) {
			return true
		}
	}
	return false
}

// Bad arguments are usage errors (exit 2) found before any connection is
// made, so an operator learns of a typo even when the database is down, and
// a wrong -limit is not quietly replaced. The database here is unreachable:
// a command that connected first would answer 1 ("connect: ...").
func TestBadArgumentsExitTwoBeforeConnecting(t *testing.T) {
	const unreachable = "postgres://postgres@127.0.0.1:1/none?sslmode=disable&connect_timeout=2"
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"replay", "-id", "not-a-uuid"}, "not a UUID"},
		{[]string{"replay", "-consumer", "notifications"}, "replay needs"}, // names nothing
		{[]string{"replay"}, "replay needs"},
		{[]string{"failed", "-limit", "-5"}, "-limit"},
		{[]string{"failed", "-limit", "0"}, "-limit"},
	} {
		code, _, errOut := inboxctl(t, append([]string{"-database-url", unreachable}, c.args...)...)
		if code != 2 || strings.Contains(errOut, "connect") || !strings.Contains(errOut, c.want) {
			t.Errorf("%v: exit %d, stderr %q; want 2 saying %q, without connecting", c.args, code, strings.TrimSpace(errOut), c.want)
		}
	}
}
