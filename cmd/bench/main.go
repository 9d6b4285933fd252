// Command bench measures the library against bare baselines on the same
// servers, side by side, in one process and one run, and prints a table
// (and writes a JSON file) with each library figure as a ratio to its
// baseline and the targets it is held to.
//
//	scripts/stack.sh with go run ./cmd/bench [flags]     (or: make bench)
//
// What it measures (see README "Performance"):
//
//  1. PostgreSQL baselines: bare single-row INSERT transactions/s, and the
//     bare rewards transaction (INSERT dedupe + INSERT credit + UPDATE
//     wallet), at each -conns.
//  2. SQS baselines: SendMessageBatch msgs/s, Receive+DeleteMessageBatch
//     msgs/s, and SendMessage→ReceiveMessage latency.
//  3. The library: Consumer.Handle for new and for duplicate messages,
//     HandleBatch (10 per call), Inbox.Receive, the outbox relay (1 and 2
//     replicas) and its commit→queue latency (LISTEN/NOTIFY and polling).
//  4. The producer: the payments transaction and a bare INSERT, each with
//     and without its outbox row (and the wake-up after commit).
//  5. The peers (bench/peers, a module of its own): Watermill's Forwarder
//     against the relay, River against the inbox pipeline.
//  6. Drains: -drain-msgs events pre-filled, the real rewards (1 and 2
//     replicas) and notifications processes timed from start to the last
//     effect, against a bare receive+delete drain and the bare batched
//     rewards transaction.
//  7. The pipeline: -payments payments through the payments HTTP API with
//     the four services running, payments/s and the latency from the
//     payment's commit to the cashback commit and to the SMS being SENT.
//  8. With -soak D: the pipeline at full load for D, sampling each
//     service's RSS every 5 s.
//
// Every measurement gets its own fresh database (CREATE DATABASE
// bench_<run>_<x> on the server of DATABASE_URL, dropped afterwards) and its
// own queues (bench-<run>-<x>, deleted afterwards); the pipeline's services
// get fresh databases and queues too. The bench never touches service data.
//
// The machine is usually small and shared (2 cores here), so throughput
// figures are taken in interleaved rounds (bare, library, bare, library,
// ...; -rounds, -sqs-rounds, -drain-rounds, at least 5 by default) and each
// is the median of its rounds, so that a burst of load from elsewhere hits
// both sides alike; a ratio is the median of the per-round ratios, printed
// with its quartiles and extremes, and a target is met only when the lower
// quartile meets it. The JSON keeps every round and, per measurement, the
// cores each process group used (PostgreSQL, the SQS server, the bench,
// the services, "other").
//
// It exits 0 when targets are missed (it is a measurement) and non-zero only
// when something failed.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"time"
)

type options struct {
	duration     time.Duration
	conns        []int
	payments     int
	soak         time.Duration
	out          string
	skipPipeline bool
	relayRows    int
	rounds       int
	sqsRounds    int
	only         map[string]bool
	basePort     int
	root         string
	drainMsgs    int
	profileDir   string
	profileSecs  int
	drainRounds  int
	// notificationsBefore is the notifications drain rate measured before
	// batching; its target is 3x that.
	notificationsBefore float64
	peers               string
	// peerRate and peerSeconds shape the paced latency rounds of the inbox
	// pipeline vs River: events offered per second, for how long.
	peerRate    float64
	peerSeconds float64
	// cpuProfile, if set, is where the bench process's CPU profile goes:
	// the library's code under test (relay, consumers, inbox) runs in it.
	cpuProfile string
}

func main() {
	var o options
	var conns string
	flag.DurationVar(&o.duration, "duration", 3*time.Second, "time per throughput measurement")
	flag.StringVar(&conns, "conns", "1,8", "comma-separated connection counts for the PostgreSQL measurements")
	flag.IntVar(&o.payments, "payments", 300, "payments sent through the HTTP API in the pipeline measurement")
	flag.DurationVar(&o.soak, "soak", 0, "run the pipeline at full load this long, sampling each service's RSS every 5s (0: skip)")
	flag.StringVar(&o.out, "out", "bench.json", "where to write the JSON results")
	flag.BoolVar(&o.skipPipeline, "skip-pipeline", false, "skip the pipeline (and soak) measurements, which start the services")
	flag.IntVar(&o.relayRows, "relay-rows", 40000, "outbox rows (and SQS messages) per relay / SQS throughput measurement, split over -sqs-rounds")
	flag.IntVar(&o.sqsRounds, "sqs-rounds", 5, "SQS throughput measurements are interleaved in this many rounds; each figure is the median of its rounds")
	flag.IntVar(&o.rounds, "rounds", 6, "PostgreSQL measurements are interleaved in this many rounds of -duration/rounds each; each figure is the median of its rounds")
	flag.IntVar(&o.basePort, "base-port", 0, "run the pipeline's services on ports base (payments), base+1 (rewards), base+2 (notifications), base+9 (SMS provider) instead of the stack's 8081-8083, 8090")
	flag.IntVar(&o.drainMsgs, "drain-msgs", 20000, "messages pre-filled per drain measurement")
	flag.StringVar(&o.profileDir, "profile", "", "write a CPU profile of each drained service (its first round, over -profile-seconds) to this directory, via the service's PPROF_ADDR")
	flag.IntVar(&o.profileSecs, "profile-seconds", 5, "length of each -profile CPU profile; keep it below the drain's duration")
	flag.IntVar(&o.drainRounds, "drain-rounds", 5, "drain measurements are interleaved in this many rounds")
	flag.Float64Var(&o.notificationsBefore, "notifications-drain-before", 179, "the notifications drain rate (msgs/s) measured before batching (179, on this repository's 2-core reference machine), to hold the drain to 3x it (0: no target)")
	flag.StringVar(&o.peers, "peers", "bench/peers", "directory of the peers' module (Watermill, River), run in the same run with the same servers (empty: skip)")
	flag.Float64Var(&o.peerRate, "peer-rate", 250, "events/s offered to the inbox pipeline and to River in the latency rounds (below both capacities)")
	flag.Float64Var(&o.peerSeconds, "peer-seconds", 3, "length of each paced latency round of the inbox pipeline vs River, in seconds")
	only := flag.String("only", "", "run only these parts, comma-separated: postgres, producer, sqs, drain, peers, pipeline (default: all)")
	flag.StringVar(&o.cpuProfile, "cpuprofile", "", "write a CPU profile of the bench process, where the relay, the consumers and the inbox run, to this file (go tool pprof)")
	flag.StringVar(&o.root, "root", "", "repository root (default: found from the working directory)")
	flag.Parse()
	for _, s := range strings.Split(conns, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			fmt.Fprintf(os.Stderr, "bench: bad -conns %q\n", conns)
			os.Exit(2)
		}
		o.conns = append(o.conns, n)
	}
	if *only != "" {
		o.only = map[string]bool{}
		for _, s := range strings.Split(*only, ",") {
			switch s = strings.TrimSpace(s); s {
			case "postgres", "producer", "sqs", "drain", "peers", "pipeline":
				o.only[s] = true
			default:
				fmt.Fprintf(os.Stderr, "bench: -only: unknown part %q (want postgres, producer, sqs, drain, peers, pipeline)\n", s)
				os.Exit(2)
			}
		}
	}
	if o.root == "" {
		root, err := findRoot()
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(2)
		}
		o.root = root
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	stopProfile := func() {}
	if o.cpuProfile != "" {
		var err error
		if stopProfile, err = startCPUProfile(o.cpuProfile); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(2)
		}
	}
	err := run(ctx, o)
	stopProfile() // also when run failed: the profile may show why
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench: error:", err)
		os.Exit(1)
	}
}

// startCPUProfile profiles the process into path until the returned func
// is called.
func startCPUProfile(path string) (stop func(), err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() {
		pprof.StopCPUProfile()
		if err := f.Close(); err != nil {
			progress("warning: cpu profile: %v", err)
		}
	}, nil
}

// findRoot walks up from the working directory to the directory with go.mod.
func findRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above the working directory: run from the repository or pass -root")
		}
		dir = parent
	}
}

func (o options) part(name string) bool { return o.only == nil || o.only[name] }

// progress lines go to stderr, so stdout carries only the table.
func progress(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "bench: "+format+"\n", args...)
}

func run(ctx context.Context, o options) error {
	// The library logs through slog.Default on a few paths; nothing of it is
	// the bench's output.
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})))
	if os.Getenv("DATABASE_URL") == "" {
		return errors.New("DATABASE_URL is not set: run it as `make bench` or `scripts/stack.sh with go run ./cmd/bench`")
	}
	if os.Getenv("AWS_ENDPOINT_URL") == "" && os.Getenv("AWS_ENDPOINT_URL_SQS") == "" {
		return errors.New("AWS_ENDPOINT_URL is not set: run it as `make bench` or `scripts/stack.sh with go run ./cmd/bench` (the bench never talks to real AWS)")
	}
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	runID := hex.EncodeToString(b)
	began := time.Now()
	rep := &report{Started: began.UTC(), Options: jsonOptions(o), RunID: runID}

	pg, err := newPGEnv(ctx, os.Getenv("DATABASE_URL"), runID)
	if err != nil {
		return err
	}
	defer pg.close()
	rep.Machine = machineInfo(ctx, pg)
	cpu = findCPUGroups(ctx, pg)
	progress("run %s on %d CPUs (%s), %s, PostgreSQL %s", runID, rep.Machine.NumCPU, rep.Machine.CPUModel, rep.Machine.GoVersion, rep.Machine.PostgresShort)

	if o.part("postgres") {
		if err := benchPostgres(ctx, pg, o, rep); err != nil {
			return fmt.Errorf("postgres measurements: %w", err)
		}
	}
	if o.part("producer") {
		if err := benchProducer(ctx, pg, o, rep); err != nil {
			return fmt.Errorf("producer measurements: %w", err)
		}
	}
	if o.part("sqs") || o.part("peers") {
		if peerCmd, err = buildPeers(ctx, o, runID); err != nil {
			return err
		}
	}
	sq, err := newSQSEnv(ctx, runID)
	if err != nil {
		return err
	}
	defer sq.close()
	if o.part("sqs") {
		if err := benchSQS(ctx, pg, sq, o, rep); err != nil {
			return fmt.Errorf("SQS measurements: %w", err)
		}
	}
	if o.part("peers") {
		if err := benchInboxVsRiver(ctx, pg, peerCmd, o, rep); err != nil {
			return fmt.Errorf("peers: %w", err)
		}
	}
	if o.part("drain") && !o.skipPipeline {
		if err := benchDrain(ctx, pg, sq, o, rep); err != nil {
			return fmt.Errorf("drain: %w", err)
		}
	}
	if o.part("pipeline") && !o.skipPipeline {
		if err := benchPipeline(ctx, pg, sq, o, rep); err != nil {
			return fmt.Errorf("pipeline: %w", err)
		}
	}
	rep.Elapsed = time.Since(began).Round(time.Millisecond).String()
	rep.print(os.Stdout)
	if err := rep.write(o.out); err != nil {
		return err
	}
	progress("done in %s; results in %s", rep.Elapsed, o.out)
	return nil
}
