// Command benchstores measures the dedupe stores beside PostgreSQL:
//
//  1. the DynamoDB consumer (idemdynamo) against a bare TransactWriteItems
//     of the same three actions (dedupe Put, credit Put, wallet ADD) on the
//     same server, in interleaved rounds (bare, consumer, bare, ...), each
//     figure the median of its rounds;
//
//  2. a replay of -replay events (20,000) that are all applied already,
//     with the Redis pre-filter off and on, on PostgreSQL
//     (idempotent.Consumer), and of -replay-dynamodb events on DynamoDB,
//     interleaved by chunk (off, on, on, off, ...);
//
//  3. a table of what one message costs in each store: round trips and
//     writes counted on the wire, and DynamoDB write units from the
//     documented pricing (a transactional write costs 2 WCU per KB of each
//     item, rounded up, and is charged when the transaction is cancelled
//     too).
//
//     scripts/stack.sh with go run ./cmd/benchstores [flags]   (make bench runs it)
//
// It needs DATABASE_URL (a fresh database is created and dropped), and
// starts its own moto (python3 -m moto.server, or MOTO_ENDPOINT_URL) and
// redis-server (or REDIS_ADDR); where moto or Redis is missing it says so
// and skips what needs it. Figures go to stdout as a table and to -out as
// JSON.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"sort"
	"syscall"
	"text/tabwriter"
	"time"
)

type options struct {
	duration time.Duration // per throughput measurement, split over rounds
	rounds   int
	replay   int // events in the PostgreSQL replay
	replayDy int // events in the DynamoDB replay
	workers  int
	out      string
}

func main() {
	var o options
	flag.DurationVar(&o.duration, "duration", 6*time.Second, "time per side of the DynamoDB consumer vs bare measurement, split over -rounds")
	flag.IntVar(&o.rounds, "rounds", 5, "interleaved rounds per measurement; each figure is the median of its rounds")
	flag.IntVar(&o.replay, "replay", 20000, "already-applied events replayed on PostgreSQL, pre-filter off and on")
	flag.IntVar(&o.replayDy, "replay-dynamodb", 500, "already-applied events replayed on DynamoDB (moto), pre-filter off and on (0: skip); small because moto copies the whole table on every transaction")
	flag.IntVar(&o.workers, "workers", 8, "concurrent handlers in the replay")
	flag.StringVar(&o.out, "out", "bench-stores.json", "where to write the JSON results")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	slog.SetDefault(slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err := run(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "benchstores: error:", err)
		os.Exit(1)
	}
}

func progress(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "benchstores: "+format+"\n", args...)
}

// row is one line of the result table.
type row struct {
	Name     string    `json:"name"`
	Value    float64   `json:"value"`
	Unit     string    `json:"unit"`
	Baseline string    `json:"baseline,omitempty"`
	Ratio    float64   `json:"ratio,omitempty"`
	Rounds   []float64 `json:"rounds,omitempty"`
	Note     string    `json:"note,omitempty"`
}

// costRow is one line of the cost-per-message table.
type costRow struct {
	Store      string  `json:"store"`
	Case       string  `json:"case"`
	DBTrips    float64 `json:"db_round_trips"`
	RedisTrips float64 `json:"redis_round_trips"`
	Writes     float64 `json:"writes"` // rows or items written (committed)
	WCU        float64 `json:"wcu"`    // DynamoDB write units billed
	Note       string  `json:"note,omitempty"`
}

type report struct {
	Started  time.Time `json:"started"`
	Elapsed  string    `json:"elapsed"`
	NumCPU   int       `json:"num_cpu"`
	Load     [3]string `json:"loadavg_before"`
	Options  any       `json:"options"`
	Rows     []row     `json:"rows"`
	Costs    []costRow `json:"costs"`
	Skipped  []string  `json:"skipped,omitempty"`
	LoadPost [3]string `json:"loadavg_after"`
}

func run(ctx context.Context, o options) error {
	if os.Getenv("DATABASE_URL") == "" {
		return errors.New("DATABASE_URL is not set: run it as `make bench` or `scripts/stack.sh with go run ./cmd/benchstores`")
	}
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	runID := hex.EncodeToString(b)
	began := time.Now()
	rep := &report{Started: began.UTC(), NumCPU: runtime.NumCPU(), Load: loadavg(),
		Options: map[string]any{"duration": o.duration.String(), "rounds": o.rounds, "replay": o.replay, "replay_dynamodb": o.replayDy, "workers": o.workers}}
	e, err := newEnv(ctx, runID)
	if err != nil {
		return err
	}
	defer e.close()
	rep.Skipped = append(rep.Skipped, e.skipped...)
	progress("run %s; load average %v on %d CPUs", runID, rep.Load, rep.NumCPU)

	if e.dynamo != nil {
		if err := benchDynamo(ctx, e, o, rep); err != nil {
			return fmt.Errorf("dynamodb consumer vs bare: %w", err)
		}
	}
	if err := benchReplay(ctx, e, o, rep); err != nil {
		return fmt.Errorf("replay: %w", err)
	}
	if err := benchCosts(ctx, e, rep); err != nil {
		return fmt.Errorf("costs: %w", err)
	}
	rep.Elapsed = time.Since(began).Round(time.Millisecond).String()
	rep.LoadPost = loadavg()
	rep.print(os.Stdout)
	f, err := os.Create(o.out)
	if err != nil {
		return err
	}
	defer f.Close()
	enc := json.NewEncoder(f)
	enc.SetIndent("", "  ")
	if err := enc.Encode(rep); err != nil {
		return err
	}
	progress("done in %s; results in %s", rep.Elapsed, o.out)
	return nil
}

func (r *report) print(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "measurement\tvalue\tunit\tbaseline\tratio\n")
	for _, x := range r.Rows {
		ratio := ""
		if x.Ratio != 0 {
			ratio = fmt.Sprintf("%.2f×", x.Ratio)
		}
		fmt.Fprintf(tw, "%s\t%.0f\t%s\t%s\t%s\n", x.Name, x.Value, x.Unit, x.Baseline, ratio)
	}
	tw.Flush()
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "cost per message\tcase\tDB round trips\tRedis round trips\twrites\tDynamoDB WCU\tnote\n")
	for _, c := range r.Costs {
		fmt.Fprintf(tw, "%s\t%s\t%.1f\t%.1f\t%.1f\t%.1f\t%s\n", c.Store, c.Case, c.DBTrips, c.RedisTrips, c.Writes, c.WCU, c.Note)
	}
	tw.Flush()
	for _, s := range r.Skipped {
		fmt.Fprintln(w, "skipped:", s)
	}
	fmt.Fprintf(w, "load average before %v, after %v; %d CPUs; %s\n", r.Load, r.LoadPost, r.NumCPU, r.Elapsed)
}

func loadavg() [3]string {
	var l [3]string
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return l
	}
	var a, c, d string
	fmt.Sscan(string(b), &a, &c, &d)
	return [3]string{a, c, d}
}

func median(xs []float64) float64 {
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
