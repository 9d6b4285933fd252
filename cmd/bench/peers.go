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

func (p *peers) round(ctx context.Context, which string, n int) (peerResult, error) {
	var out, errb bytes.Buffer
	cmd := exec.CommandContext(ctx, p.bin, "-case", which, "-rows", strconv.Itoa(n), "-run", p.run)
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
// latencies.
func inboxPipelineRound(ctx context.Context, pg *pgEnv, r, n int) (time.Duration, []time.Duration, error) {
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
		if err := cr.apply(ctx, tx); err != nil {
			return err
		}
		now := time.Now()
		mu.Lock()
		applied[e.EventID] = now
		mu.Unlock()
		nApplied.Add(1)
		return nil
	}, idempotent.ProcessorConfig{Workers: 4, Pool: procPool, PollInterval: 50 * time.Millisecond, Logger: quiet})
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
	var next atomic.Int64
	var wg sync.WaitGroup
	var once sync.Once
	var first error
	for range 8 {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				if _, err := in.Receive(ctx, crs[i].env, crs[i].user); err != nil {
					once.Do(func() { first = err })
					return
				}
				now := time.Now()
				mu.Lock()
				stored[crs[i].env.EventID] = now
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if first != nil {
		return 0, nil, first
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
		use, err := cpuOf(func() (err error) { el, lat, err = inboxPipelineRound(ctx, pg, r, n); return err })
		if err != nil {
			return fmt.Errorf("inbox pipeline: %w", err)
		}
		inbox.add(n, el, use)
		inLat = append(inLat, percentile(sortedMillis(lat), 0.5))
		var res peerResult
		use, err = cpuOf(func() (err error) { res, err = pr.round(ctx, "river", n); return err })
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
	rep.add(&Row{Key: "peer_river_p50", Section: sec, Name: "River: InsertTx commit → effect, p50", Value: medianOf(rvP50), Unit: "ms", Rounds: rvP50})
	rep.add(&Row{Key: "inbox_pipeline_p50", Section: sec, Name: "inbox pipeline: store commit → effect, p50", Value: medianOf(inLat), Unit: "ms", Rounds: inLat})
	// Lower latency is better: River's p50 over the inbox's, per round.
	ratios := make([]float64, len(inLat))
	for i := range inLat {
		ratios[i] = rvP50[i] / inLat[i]
	}
	rep.add(&Row{Key: "inbox_pipeline_p50_vs_river", Section: sec, Name: "River's p50 / the inbox's p50 (above 1: the inbox's is lower)",
		Value: medianOf(ratios), Unit: "×", Rounds: ratios, Target: minValue(1, "×")})
	return nil
}
