package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/metric/noop"

	"github.com/effectively-once/payments-cashback/pkg/events"
	"github.com/effectively-once/payments-cashback/pkg/idempotent"

	"github.com/effectively-once/payments-cashback/internal/benchfeed"
)

// The peers (Watermill, River) live in their own module (bench/peers), so
// the library's module never depends on them. The bench builds that
// module's command once and runs it for each of its rounds, interleaved
// with the library's rounds, on the same servers.

type peerResult struct {
	Case    string         `json:"case"`
	Count   int            `json:"count"`
	Seconds float64        `json:"seconds"`
	Rate    float64        `json:"rate"`
	P50ms   float64        `json:"p50_ms"`
	P99ms   float64        `json:"p99_ms"`
	Config  map[string]any `json:"config"`
}

// peerCmd is the built peers command (nil: -peers "").
var peerCmd *peers

type peers struct {
	bin string
	run string
}

// buildPeers builds bench/peers into bin/peers; nil when -peers is empty.
func buildPeers(ctx context.Context, o options, run string) (*peers, error) {
	if o.peers == "" {
		return nil, nil
	}
	dir := o.peers
	if !filepath.IsAbs(dir) {
		dir = filepath.Join(o.root, dir)
	}
	bin := filepath.Join(o.root, "bin", "peers")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, ".")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("build the peers (%s): %v\n%s", dir, err, out)
	}
	return &peers{bin: bin, run: run}, nil
}

// round runs one round of the peer which with n rows or jobs; rate > 0
// (River only) offers them at that many per second instead of at once.
func (p *peers) round(ctx context.Context, which string, n int, rate float64) (peerResult, error) {
	var out, errb bytes.Buffer
	args := []string{"-case", which, "-rows", strconv.Itoa(n), "-run", p.run}
	if rate > 0 {
		args = append(args, "-rate", strconv.FormatFloat(rate, 'f', -1, 64))
	}
	cmd := exec.CommandContext(ctx, p.bin, args...)
	cmd.Stdout, cmd.Stderr, cmd.Env = &out, &errb, os.Environ()
	if err := cmd.Run(); err != nil {
		return peerResult{}, fmt.Errorf("peer %s: %v: %s", which, err, bytes.TrimSpace(errb.Bytes()))
	}
	var r peerResult
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		return peerResult{}, fmt.Errorf("peer %s: %v: %q", which, err, out.String())
	}
	return r, nil
}

// inboxPipelineRound is the library's side of the River comparison: n
// events stored with Inbox.Receive (8 at once, each an autocommitted
// INSERT, as the SQS receiver does before acking), the inbox's Processor
// applying the same effect as River's worker (a credit row and a wallet
// move) with the row's DONE in the same transaction. It returns the time
// from the first store to the last effect and the commit → effect
// latencies. rate 0 stores as fast as the 8 go (throughput); rate > 0
// offers the events at that many per second (latency at a load under
// capacity), as River's paced round does.
func inboxPipelineRound(ctx context.Context, pg *pgEnv, r, n int, rate float64) (time.Duration, []time.Duration, error) {
	pool, drop, err := setupRewardsDB(ctx, pg, fmt.Sprintf("inboxpipe_%d", r), 10)
	if err != nil {
		return 0, nil, err
	}
	defer drop()
	in, err := idempotent.NewInbox(pool, consumerName, idempotent.InboxConfig{Logger: quiet, MeterProvider: noop.NewMeterProvider()})
	if err != nil {
		return 0, nil, err
	}
	defer in.Close()
	var mu sync.Mutex
	stored := make(map[uuid.UUID]time.Time, n)
	applied := make(map[uuid.UUID]time.Time, n)
	var nApplied atomic.Int64
	cfgp := pool.Config().Copy()
	cfgp.MaxConns = 6
	procPool, err := pgxpool.NewWithConfig(ctx, cfgp)
	if err != nil {
		return 0, nil, err
	}
	defer procPool.Close()
	proc, err := in.NewProcessor(func(ctx context.Context, tx pgx.Tx, e events.Envelope) error {
		var p struct {
			PaymentID string `json:"payment_id"`
			UserID    string `json:"user_id"`
		}
		if err := json.Unmarshal(e.Payload, &p); err != nil {
			return err
		}
		cr := credit{env: e, payment: p.PaymentID, user: p.UserID, amount: 2400}
		return cr.apply(ctx, tx)
	}, idempotent.ProcessorConfig{Workers: 4, Pool: procPool, PollInterval: 50 * time.Millisecond, Logger: quiet,
		// Stamped once the effect is committed, as River's side is.
		AfterCommit: func(ids []uuid.UUID) {
			now := time.Now()
			mu.Lock()
			for _, id := range ids {
				applied[id] = now
			}
			mu.Unlock()
			nApplied.Add(int64(len(ids)))
		}})
	if err != nil {
		return 0, nil, err
	}
	crs := make([]credit, n)
	for i := range crs {
		if crs[i], err = newCredit(); err != nil {
			return 0, nil, err
		}
	}
	pctx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan error, 1)
	go func() { done <- proc.Run(pctx) }()
	defer func() { stop(); <-done }()
	start := time.Now()
	if err := benchfeed.Feed(ctx, n, rate, 8, func(i int) error {
		if _, err := in.Receive(ctx, crs[i].env, crs[i].user); err != nil {
			return err
		}
		now := time.Now()
		mu.Lock()
		stored[crs[i].env.EventID] = now
		mu.Unlock()
		return nil
	}); err != nil {
		return 0, nil, err
	}
	if err := waitUntil(ctx, 5*time.Minute, 5*time.Millisecond, "every inbox row applied", func() (bool, error) {
		return nApplied.Load() >= int64(n), nil
	}); err != nil {
		return 0, nil, err
	}
	el := time.Since(start)
	mu.Lock()
	defer mu.Unlock()
	var lat []time.Duration
	for id, s := range stored {
		if a, ok := applied[id]; ok {
			lat = append(lat, a.Sub(s))
		}
	}
	return el, lat, nil
}

// benchInboxVsRiver interleaves the library's inbox pipeline with River.
func benchInboxVsRiver(ctx context.Context, pg *pgEnv, pr *peers, o options, rep *report) error {
	const sec = "Peers: the inbox pipeline vs River (store in the receiving tx, then a worker applies the rewards effect)"
	if pr == nil {
		return nil
	}
	n := max(500, o.relayRows/max(1, o.sqsRounds)/3)
	rounds := max(1, o.sqsRounds)
	progress("peers: inbox pipeline vs River, %d events per round, %d rounds", n, rounds)
	inbox := &series{key: "inbox_pipeline", name: "inbox pipeline: Inbox.Receive (8 at once) + Processor (4 workers), rewards effect", unit: "events/s"}
	river := &series{key: "peer_river", name: "River v0.51.2: InsertTx (8 at once) + workers, same effect, JobCompleteTx", unit: "jobs/s"}
	var inLat, rvP50 []float64
	var rvCfg map[string]any
	for r := range rounds {
		var el time.Duration
		var lat []time.Duration
		use, err := cpuOf(func() (err error) { el, lat, err = inboxPipelineRound(ctx, pg, r, n, 0); return err })
		if err != nil {
			return fmt.Errorf("inbox pipeline: %w", err)
		}
		inbox.add(n, el, use)
		inLat = append(inLat, percentile(sortedMillis(lat), 0.5))
		var res peerResult
		use, err = cpuOf(func() (err error) { res, err = pr.round(ctx, "river", n, 0); return err })
		if err != nil {
			return err
		}
		river.add(n, time.Duration(res.Seconds*float64(time.Second)), use)
		rvP50 = append(rvP50, res.P50ms)
		rvCfg = res.Config
		progress("peers: round %d: inbox %.0f/s p50 %.1f ms, River %.0f/s p50 %.1f ms", r+1, float64(n)/el.Seconds(), inLat[r], res.Rate, res.P50ms)
	}
	river.details = map[string]any{"config": rvCfg, "p50_ms_per_round": rvP50}
	inbox.details = map[string]any{"p50_ms_per_round": inLat}
	river.row(rep, sec)
	inbox.base, inbox.target = "peer_river", minRatio(1)
	inbox.row(rep, sec)
	// At full throughput the inbox stores faster than its processor
	// applies, so these p50s mostly measure the backlog the round builds
	// (its length), not the pipeline: informational, no target. The
	// latency target is on the paced rounds (benchInboxVsRiverPaced).
	rep.add(&Row{Key: "peer_river_p50", Section: sec, Name: "River at full throughput: InsertTx commit → effect, p50", Value: medianOf(rvP50), Unit: "ms", Rounds: rvP50})
	rep.add(&Row{Key: "inbox_pipeline_p50", Section: sec, Name: "inbox pipeline at full throughput: store commit → effect, p50", Value: medianOf(inLat), Unit: "ms", Rounds: inLat})
	return benchInboxVsRiverPaced(ctx, pg, pr, o, rep)
}

// benchInboxVsRiverPaced measures commit → effect latency where it means
// something: both pipelines offered the same events per second (-peer-rate,
// paced, below both capacities) for -peer-seconds, in interleaved rounds.
// The target: River's p50 over the inbox's, per round, at least 1 in the
// lower quartile.
func benchInboxVsRiverPaced(ctx context.Context, pg *pgEnv, pr *peers, o options, rep *report) error {
	rate := o.peerRate
	if rate <= 0 {
		return nil
	}
	sec := fmt.Sprintf("Peers: commit → effect latency, inbox pipeline vs River, both offered %s events/s", trimFloat(rate))
	n := max(50, int(rate*o.peerSeconds))
	// Twice the throughput part's rounds, each short: on a shared machine
	// a burst of load lasts seconds, and more, shorter rounds let the
	// quartiles of the per-round ratio leave it out.
	rounds := max(5, 2*o.sqsRounds)
	progress("peers: latency at %s events/s offered, %d events per round, %d rounds", trimFloat(rate), n, rounds)
	var inP50, inP99, rvP50, rvP99, ratios, inRate, rvRate []float64
	var rvCfg map[string]any
	for r := range rounds {
		// Alternate which side goes first, so that neither always runs
		// right after the other's database was dropped.
		inbox := func() error {
			el, lat, err := inboxPipelineRound(ctx, pg, r, n, rate)
			if err != nil {
				return fmt.Errorf("inbox pipeline, paced: %w", err)
			}
			ms := sortedMillis(lat)
			inP50, inP99 = append(inP50, percentile(ms, 0.5)), append(inP99, percentile(ms, 0.99))
			inRate = append(inRate, float64(n)/el.Seconds())
			return nil
		}
		river := func() error {
			res, err := pr.round(ctx, "river", n, rate)
			if err != nil {
				return err
			}
			rvP50, rvP99 = append(rvP50, res.P50ms), append(rvP99, res.P99ms)
			rvRate = append(rvRate, res.Rate)
			rvCfg = res.Config
			return nil
		}
		first, second := inbox, river
		if r%2 == 1 {
			first, second = river, inbox
		}
		if err := first(); err != nil {
			return err
		}
		if err := second(); err != nil {
			return err
		}
		ratios = append(ratios, rvP50[r]/inP50[r])
		progress("peers: paced round %d: inbox p50 %.1f ms p99 %.1f ms, River p50 %.1f ms p99 %.1f ms, River/inbox p50 %.2f×",
			r+1, inP50[r], inP99[r], rvP50[r], rvP99[r], ratios[r])
	}
	offered := trimFloat(rate) + " events/s offered"
	d := func(rates []float64) map[string]any {
		return map[string]any{"offered_rate": rate, "events_per_round": n, "achieved_rate_per_round": rates}
	}
	rvD := d(rvRate)
	rvD["config"] = rvCfg
	rep.add(&Row{Key: "inbox_pipeline_paced_p50", Section: sec, Name: "inbox pipeline, " + offered + ": store commit → effect, p50", Value: medianOf(inP50), Unit: "ms", Rounds: inP50, Details: d(inRate)})
	rep.add(&Row{Key: "inbox_pipeline_paced_p99", Section: sec, Name: "inbox pipeline, " + offered + ": store commit → effect, p99", Value: medianOf(inP99), Unit: "ms", Rounds: inP99})
	rep.add(&Row{Key: "peer_river_paced_p50", Section: sec, Name: "River, " + offered + ": InsertTx commit → effect, p50", Value: medianOf(rvP50), Unit: "ms", Rounds: rvP50, Details: rvD})
	rep.add(&Row{Key: "peer_river_paced_p99", Section: sec, Name: "River, " + offered + ": InsertTx commit → effect, p99", Value: medianOf(rvP99), Unit: "ms", Rounds: rvP99})
	// Lower latency is better: River's p50 over the inbox's, per round.
	rep.add(&Row{Key: "inbox_pipeline_p50_vs_river", Section: sec, Name: "River's p50 / the inbox's p50, " + offered + " (above 1: the inbox's is lower)",
		Value: medianOf(ratios), Unit: "×", Rounds: ratios, Target: minValue(1, "×")})
	return nil
}
