// Command inboxctl is the operator's tool for the inbox (pkg/idempotent):
//
//	inboxctl [-database-url URL] failed  [-consumer X] [-event-type T] [-limit N]
//	inboxctl [-database-url URL] replay  -id UUID [-consumer X]
//	inboxctl [-database-url URL] replay  -consumer X (-event-type T | -all-failed)
//	inboxctl [-database-url URL] backlog [-consumer X]
//
// failed lists FAILED rows with their last error and how many rows of the
// same ordering key each one holds back. replay returns FAILED rows to
// PENDING with a fresh attempt budget (run it after deploying the fix); it
// never touches DONE rows. backlog prints, per consumer, the PENDING count,
// the age of the oldest PENDING row and the FAILED count, the same figures
// as the gauges inbox_pending, inbox_oldest_pending_age_seconds and
// inbox_failed.
//
// -database-url defaults to $DATABASE_URL and may also follow the
// subcommand.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/effectively-once/payments-cashback/pkg/idempotent"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

const usage = `usage:
  inboxctl [-database-url URL] failed  [-consumer X] [-event-type T] [-limit N]
  inboxctl [-database-url URL] replay  -id UUID [-consumer X]
  inboxctl [-database-url URL] replay  -consumer X (-event-type T | -all-failed)
  inboxctl [-database-url URL] backlog [-consumer X]
`

// run is main without the process: it returns the exit code (0 ok, 1
// failure, 2 bad usage).
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	global := flag.NewFlagSet("inboxctl", flag.ContinueOnError)
	global.SetOutput(stderr)
	global.Usage = func() { fmt.Fprint(stderr, usage) }
	dbURL := global.String("database-url", os.Getenv("DATABASE_URL"), "PostgreSQL URL of the service's database")
	if err := global.Parse(args); err != nil {
		return 2
	}
	if global.NArg() == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	cmd, rest := global.Arg(0), global.Args()[1:]
	fs := flag.NewFlagSet("inboxctl "+cmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, usage); fs.PrintDefaults() }
	fs.StringVar(dbURL, "database-url", *dbURL, "PostgreSQL URL of the service's database")
	consumer := fs.String("consumer", "", "consumer name (the inbox's owner, e.g. notifications)")

	// Each verb's prepare runs after its flags are parsed and before any
	// connection: a bad argument is exit 2 even while the database is down.
	var prepare func() (func(ctx context.Context, conn *pgx.Conn) error, error)
	switch cmd {
	case "failed":
		eventType := fs.String("event-type", "", "only rows of this event type")
		limit := fs.Int("limit", 50, "at most this many rows (at least 1)")
		prepare = func() (func(ctx context.Context, conn *pgx.Conn) error, error) {
			if *limit < 1 {
				return nil, fmt.Errorf("-limit %d: want at least 1", *limit)
			}
			f := idempotent.FailedFilter{Consumer: *consumer, EventType: *eventType, Limit: *limit}
			return func(ctx context.Context, conn *pgx.Conn) error { return failed(ctx, conn, stdout, f) }, nil
		}
	case "replay":
		id := fs.String("id", "", "event id of the FAILED row to replay")
		eventType := fs.String("event-type", "", "replay the consumer's FAILED rows of this event type")
		all := fs.Bool("all-failed", false, "replay every FAILED row of the consumer")
		prepare = func() (func(ctx context.Context, conn *pgx.Conn) error, error) {
			f := idempotent.ReplayFilter{Consumer: *consumer, EventType: *eventType, AllFailed: *all}
			if *id != "" {
				var err error
				if f.EventID, err = uuid.Parse(*id); err != nil {
					return nil, fmt.Errorf("-id %q is not a UUID", *id)
				}
			}
			if err := f.Validate(); err != nil {
				return nil, err
			}
			return func(ctx context.Context, conn *pgx.Conn) error { return replay(ctx, conn, stdout, f) }, nil
		}
	case "backlog":
		prepare = func() (func(ctx context.Context, conn *pgx.Conn) error, error) {
			return func(ctx context.Context, conn *pgx.Conn) error { return backlog(ctx, conn, stdout, *consumer) }, nil
		}
	default:
		fmt.Fprintf(stderr, "inboxctl: unknown command %q\n%s", cmd, usage)
		return 2
	}
	if err := fs.Parse(rest); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "inboxctl %s: unexpected arguments %q\n", cmd, fs.Args())
		return 2
	}
	exec, err := prepare()
	if err != nil {
		fmt.Fprintf(stderr, "inboxctl %s: %v\n", cmd, err)
		return 2
	}
	if *dbURL == "" {
		fmt.Fprintln(stderr, "inboxctl: no database: pass -database-url or set DATABASE_URL")
		return 2
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, *dbURL)
	if err != nil {
		fmt.Fprintf(stderr, "inboxctl: connect: %v\n", err)
		return 1
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if err := exec(ctx, conn); err != nil {
		fmt.Fprintf(stderr, "inboxctl %s: %v\n", cmd, err)
		return 1
	}
	return 0
}

func failed(ctx context.Context, q idempotent.Querier, w io.Writer, f idempotent.FailedFilter) error {
	rows, err := idempotent.ListFailed(ctx, q, f)
	if err != nil {
		return err
	}
	if len(rows) == 0 {
		fmt.Fprintln(w, "no FAILED rows")
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CONSUMER\tEVENT_ID\tEVENT_TYPE\tORDERING_KEY\tVERSION\tATTEMPTS\tBLOCKED\tRECEIVED\tLAST_ERROR")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%d\t%s\t%s\n", r.Consumer, r.EventID, r.EventType, r.OrderingKey,
			r.AggregateVersion, r.Attempts, r.Blocked, r.ReceivedAt.UTC().Format(time.RFC3339), oneLine(r.LastError, 120))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(rows) == f.Limit {
		fmt.Fprintf(w, "(first %d rows; raise -limit for more)\n", f.Limit)
	}
	return nil
}

func replay(ctx context.Context, q idempotent.Querier, w io.Writer, f idempotent.ReplayFilter) error {
	rows, err := idempotent.Replay(ctx, q, f)
	if err != nil {
		return err
	}
	if len(rows) == 0 {
		fmt.Fprintln(w, "no FAILED row matched; nothing replayed")
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CONSUMER\tEVENT_ID")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\n", r.Consumer, r.EventID)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "replayed %d row(s): back to PENDING, due now\n", len(rows))
	return nil
}

func backlog(ctx context.Context, q idempotent.Querier, w io.Writer, consumer string) error {
	bs, err := idempotent.InboxBacklog(ctx, q, consumer)
	if err != nil {
		return err
	}
	if len(bs) == 0 {
		bs = []idempotent.Backlog{{Consumer: consumer}}
		if consumer == "" {
			fmt.Fprintln(w, "no PENDING or FAILED rows")
			return nil
		}
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CONSUMER\tPENDING\tOLDEST_PENDING\tFAILED")
	for _, b := range bs {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%d\n", b.Consumer, b.Pending, b.OldestPending.Round(time.Second), b.Failed)
	}
	return tw.Flush()
}

// oneLine flattens an error text for a table cell and cuts it to n runes.
func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}
