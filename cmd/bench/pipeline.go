package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/effectively-once/payments-cashback/internal/stack"
)

// pipelineConcurrency is how many POST /v1/payments run at once.
const pipelineConcurrency = 8

type soakResult struct {
	Duration  string        `json:"duration"`
	Interval  string        `json:"interval"`
	Warmup    string        `json:"warmup"`
	Posted    int64         `json:"payments_posted"`
	Sent      int64         `json:"sms_sent_during"`
	Services  []serviceRSS  `json:"services"`
	SamplesAt []float64     `json:"sample_seconds"`
	Samples   [][]float64   `json:"samples_mib"` // per service, in Services' order
	elapsed   time.Duration // of the load
}

type serviceRSS struct {
	Name     string  `json:"name"`
	Pid      int     `json:"pid"`
	FirstMiB float64 `json:"first_mib"`
	LastMiB  float64 `json:"last_mib"`
	MaxMiB   float64 `json:"max_mib"`
	DriftPct float64 `json:"drift_pct"`
}

// pipeline is the running stack of the four services on fresh databases
// and queues.
type pipeline struct {
	local                  *stack.Local
	payments, rewards, nfs *pgxpool.Pool
	paymentsURL, apiKey    string
	run                    string
	http                   *http.Client
	seq                    atomic.Int64
}

func benchPipeline(ctx context.Context, pg *pgEnv, sq *sqsEnv, o options, rep *report) error {
	const sec = "Pipeline: payments API → rewards → notifications (4 service processes)"
	progress("pipeline: fresh databases and queues, building and starting the services")
	p, closeAll, err := startPipeline(ctx, pg, sq, o, "svc")
	if err != nil {
		return err
	}
	defer closeAll()

	// N payments at concurrency 8, then wait for every SMS.
	for _, name := range stack.Services {
		cpu.extra[name] = p.local.PID(name)
	}
	defer func() { cpu.extra = map[string]int{} }()
	s0 := cpu.sample()
	start := time.Now()
	posted, postLat, err := p.post(ctx, o.payments, 0)
	if err != nil {
		return err
	}
	postElapsed := time.Since(start)
	progress("pipeline: %d payments posted in %s; waiting for their cashback and SMS", len(posted), postElapsed.Round(time.Millisecond))
	if err := p.waitSent(ctx, int64(len(posted)), 3*time.Minute); err != nil {
		return err
	}
	use := s0.until(cpu.sample())
	lat, err := p.latencies(ctx)
	if err != nil {
		return err
	}
	if lat.n != len(posted) {
		return fmt.Errorf("pipeline: %d payments posted, %d traced through to SMS SENT", len(posted), lat.n)
	}
	pl := sortedMillis(postLat)
	rep.add(&Row{Key: "pipeline_payments_per_s", Section: sec, Name: fmt.Sprintf("POST /v1/payments, %d payments, concurrency %d", len(posted), pipelineConcurrency),
		Value: float64(len(posted)) / postElapsed.Seconds(), Unit: "payments/s",
		Details: map[string]any{"http_p50_ms": percentile(pl, 0.5), "http_p99_ms": percentile(pl, 0.99), "elapsed_s": postElapsed.Seconds()}})
	rep.add(&Row{Key: "pipeline_e2e_per_s", Section: sec, Name: "end to end: first payment commit → last SMS SENT",
		Value: float64(lat.n) / lat.span.Seconds(), Unit: "payments/s", Details: map[string]any{"span_s": lat.span.Seconds(), "cpu_cores": use.rounded()},
		// What the pipeline did before this bench was written: it must not
		// get slower. One round, so judged on its one value.
		Target: minValue(152, "payments/s")})
	rep.add(&Row{Key: "pipeline_credit_p50", Section: sec, Name: "payment commit → cashback commit, p50", Value: percentile(lat.credit, 0.5), Unit: "ms"})
	rep.add(&Row{Key: "pipeline_credit_p99", Section: sec, Name: "payment commit → cashback commit, p99", Value: percentile(lat.credit, 0.99), Unit: "ms"})
	rep.add(&Row{Key: "pipeline_sms_p50", Section: sec, Name: "payment commit → SMS SENT, p50", Value: percentile(lat.sms, 0.5), Unit: "ms"})
	rep.add(&Row{Key: "pipeline_sms_p99", Section: sec, Name: "payment commit → SMS SENT, p99", Value: percentile(lat.sms, 0.99), Unit: "ms"})

	if o.soak > 0 {
		return p.soak(ctx, o.soak, rep)
	}
	return nil
}

// startPipeline starts the four services on fresh databases
// (bench_<run>_<tag>_<service>) and queues (<tag>-payments-events, ...).
func startPipeline(ctx context.Context, pg *pgEnv, sq *sqsEnv, o options, tag string) (*pipeline, func(), error) {
	var cleanups []func()
	closeAll := func() {
		for i := len(cleanups) - 1; i >= 0; i-- {
			cleanups[i]()
		}
	}
	fail := func(err error) (*pipeline, func(), error) { closeAll(); return nil, nil, err }

	// The infrastructure's endpoints come from this process's environment
	// (scripts/stack.sh with loads .stack/env into it); the databases and
	// queues are the bench's own.
	env := map[string]string{}
	for _, k := range []string{"AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_SQS", "AWS_REGION", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
		"STRIPE_URL", "PAYMENTS_URL", "REWARDS_URL", "NOTIFICATIONS_URL", "SMS_PROVIDER_URL"} {
		if v := os.Getenv(k); v != "" {
			env[k] = v
		}
	}
	p := &pipeline{run: pg.run, http: &http.Client{Timeout: 30 * time.Second,
		Transport: &http.Transport{MaxIdleConnsPerHost: 2 * pipelineConcurrency}}}
	dbs := map[string]**pgxpool.Pool{"payments": &p.payments, "rewards": &p.rewards, "notifications": &p.nfs}
	for _, svc := range []string{"payments", "rewards", "notifications"} {
		db := "bench_" + pg.run + "_" + tag + "_" + svc
		if err := pg.createDB(ctx, db); err != nil {
			return fail(err)
		}
		cleanups = append(cleanups, func() { pg.drop(db) })
		cfg := pg.cfg.Copy()
		cfg.ConnConfig.Database = db
		cfg.MaxConns = 2
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			return fail(err)
		}
		cleanups = append(cleanups, pool.Close)
		*dbs[svc] = pool
		env[strings.ToUpper(svc)+"_DATABASE_URL"] = pg.connString(db)
	}
	for _, q := range []struct{ name, envVar string }{{"payments-events", "PAYMENTS_QUEUE"}, {"rewards-events", "REWARDS_QUEUE"}} {
		url, del, err := sq.queue(ctx, tag+"-"+q.name, 30*time.Second)
		if err != nil {
			return fail(err)
		}
		cleanups = append(cleanups, del)
		env[q.envVar] = queueName(url)
	}
	if o.basePort > 0 {
		for svc, off := range map[string]int{"PAYMENTS_URL": 0, "REWARDS_URL": 1, "NOTIFICATIONS_URL": 2, "SMS_PROVIDER_URL": 9} {
			env[svc] = fmt.Sprintf("http://127.0.0.1:%d", o.basePort+off)
		}
	}
	// Services log every payment and event at info; a tuned deployment
	// logs warnings and up.
	env["LOG_LEVEL"] = "warn"
	l, err := stack.StartLocal(ctx, stack.Options{Root: o.root, Env: env, Ready: 2 * time.Minute})
	if err != nil {
		var busy *stack.PortInUseError
		if errors.As(err, &busy) {
			return fail(fmt.Errorf("the pipeline starts the four services on the stack's ports (default 8081-8083, 8090): %w; or pass -base-port N, or -skip-pipeline", err))
		}
		return fail(err)
	}
	cleanups = append(cleanups, func() { _ = l.Close() })
	p.local = l
	p.paymentsURL, p.apiKey = l.URL(stack.Payments), l.APIKey()
	return p, closeAll, nil
}

// post sends n payments (n <= 0: until ctx ends or d passes) at
// concurrency 8 and returns their ids and HTTP latencies.
func queueName(url string) string { return url[strings.LastIndex(url, "/")+1:] }

func (p *pipeline) post(ctx context.Context, n int, d time.Duration) ([]string, []time.Duration, error) {
	var (
		mu   sync.Mutex
		ids  []string
		lats []time.Duration
		wg   sync.WaitGroup
		once sync.Once
		ferr error
	)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var deadline time.Time
	if d > 0 {
		deadline = time.Now().Add(d)
	}
	var left atomic.Int64
	left.Store(int64(n))
	for range pipelineConcurrency {
		wg.Go(func() {
			for ctx.Err() == nil {
				if n > 0 && left.Add(-1) < 0 {
					return
				}
				if d > 0 && time.Now().After(deadline) {
					return
				}
				t := time.Now()
				id, err := p.pay(ctx)
				if err != nil {
					if ctx.Err() == nil {
						once.Do(func() { ferr = err; cancel() })
					}
					return
				}
				mu.Lock()
				ids = append(ids, id)
				lats = append(lats, time.Since(t))
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return ids, lats, ferr
}

func (p *pipeline) pay(ctx context.Context) (string, error) {
	i := p.seq.Add(1)
	body := fmt.Sprintf(`{"user_id":"u_bench_%d","amount_paise":%d,"currency":"INR","method":"upi"}`, i%100, 100000+i%1000*100)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.paymentsURL+"/v1/payments", strings.NewReader(body))
	if err != nil {
		return "", err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", fmt.Sprintf("bench-%s-%d", p.run, i))
	req.Header.Set("Authorization", "Bearer "+p.apiKey)
	resp, err := p.http.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode != http.StatusCreated {
		return "", fmt.Errorf("POST /v1/payments: %s: %s", resp.Status, bytes.TrimSpace(b))
	}
	var out struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal(b, &out); err != nil || out.ID == "" {
		return "", fmt.Errorf("POST /v1/payments: no id in %s", b)
	}
	return out.ID, nil
}

func (p *pipeline) sent(ctx context.Context) (int64, error) {
	return count(ctx, p.nfs, `SELECT count(*) FROM notifications WHERE status = 'SENT'`)
}

// waitSent waits until want SMS are SENT, failing if no progress is made for
// stall.
func (p *pipeline) waitSent(ctx context.Context, want int64, stall time.Duration) error {
	last, lastAt, lastLog := int64(-1), time.Now(), time.Now()
	for {
		n, err := p.sent(ctx)
		if err != nil {
			return err
		}
		if n >= want {
			return nil
		}
		if n != last {
			last, lastAt = n, time.Now()
		}
		if time.Since(lastAt) > stall {
			return fmt.Errorf("pipeline: %d of %d SMS SENT and no progress for %s; see the logs in .stack/logs", n, want, stall)
		}
		if time.Since(lastLog) > 5*time.Second {
			progress("pipeline: %d of %d SMS SENT", n, want)
			lastLog = time.Now()
		}
		for _, name := range stack.Services {
			if !p.local.Running(name) {
				return fmt.Errorf("pipeline: %s exited (%v); see %s", name, p.local.ExitState(name), p.local.LogPath(name))
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

type pipelineLatency struct {
	n           int
	credit, sms []float64 // ms, sorted
	span        time.Duration
}

// latencies joins, per payment, payments.created_at → cashback_credits
// .credited_at → notifications.sent_at (through the rewards outbox row of
// the CashbackCredited event, whose aggregate_id is the payment id). All
// three are timestamps of one PostgreSQL server, so the clocks agree.
func (p *pipeline) latencies(ctx context.Context) (pipelineLatency, error) {
	var out pipelineLatency
	pays := map[string]time.Time{}
	if err := collect(ctx, p.payments, `SELECT id, created_at FROM payments`, func(r pgx.Rows) error {
		var id string
		var at time.Time
		if err := r.Scan(&id, &at); err != nil {
			return err
		}
		pays[id] = at
		return nil
	}); err != nil {
		return out, err
	}
	credits := map[string]time.Time{}
	if err := collect(ctx, p.rewards, `SELECT payment_id, credited_at FROM cashback_credits`, func(r pgx.Rows) error {
		var id string
		var at time.Time
		if err := r.Scan(&id, &at); err != nil {
			return err
		}
		credits[id] = at
		return nil
	}); err != nil {
		return out, err
	}
	eventPayment := map[uuid.UUID]string{}
	if err := collect(ctx, p.rewards, `SELECT id, aggregate_id FROM outbox WHERE event_type = 'CashbackCredited'`, func(r pgx.Rows) error {
		var id uuid.UUID
		var pay string
		if err := r.Scan(&id, &pay); err != nil {
			return err
		}
		eventPayment[id] = pay
		return nil
	}); err != nil {
		return out, err
	}
	var creditLat, smsLat []time.Duration
	var first, last time.Time
	if err := collect(ctx, p.nfs, `SELECT event_id, sent_at FROM notifications WHERE status = 'SENT'`, func(r pgx.Rows) error {
		var ev uuid.UUID
		var sent time.Time
		if err := r.Scan(&ev, &sent); err != nil {
			return err
		}
		pay, ok := eventPayment[ev]
		if !ok {
			return fmt.Errorf("notification for event %s: no CashbackCredited outbox row in rewards", ev)
		}
		created, ok1 := pays[pay]
		credited, ok2 := credits[pay]
		if !ok1 || !ok2 {
			return fmt.Errorf("payment %s: payment row %v, credit row %v", pay, ok1, ok2)
		}
		out.n++
		creditLat = append(creditLat, credited.Sub(created))
		smsLat = append(smsLat, sent.Sub(created))
		if first.IsZero() || created.Before(first) {
			first = created
		}
		if sent.After(last) {
			last = sent
		}
		return nil
	}); err != nil {
		return out, err
	}
	out.credit, out.sms, out.span = sortedMillis(creditLat), sortedMillis(smsLat), last.Sub(first)
	return out, nil
}

func collect(ctx context.Context, pool *pgxpool.Pool, sql string, each func(pgx.Rows) error) error {
	rows, err := pool.Query(ctx, sql)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		if err := each(rows); err != nil {
			return err
		}
	}
	return rows.Err()
}

// rssMiB reads VmRSS of pid from /proc/<pid>/status.
func rssMiB(pid int) (float64, error) {
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		var kb float64
		if _, err := fmt.Sscanf(s.Text(), "VmRSS: %f kB", &kb); err == nil {
			return kb / 1024, nil
		}
	}
	return 0, fmt.Errorf("no VmRSS in /proc/%d/status", pid)
}

// soak runs the pipeline at full load (POSTs at concurrency 8, as fast as
// they go) for d, sampling each service's RSS every 5 s.
func (p *pipeline) soak(ctx context.Context, d time.Duration, rep *report) error {
	const sec = "Soak: RSS of each service process at full load"
	const interval = 5 * time.Second
	warm := min(time.Minute, d/5)
	names := []string{stack.Payments, stack.Rewards, stack.Notifications, stack.SMSProvider}
	res := &soakResult{Duration: d.String(), Interval: interval.String(), Warmup: warm.String(), Samples: make([][]float64, len(names))}
	pids := make([]int, len(names))
	for i, n := range names {
		pids[i] = p.local.PID(n)
	}
	sentBefore, err := p.sent(ctx)
	if err != nil {
		return err
	}
	progress("soak: %s at full load, RSS every %s", d, interval)
	begin := time.Now()
	type postResult struct {
		ids []string
		err error
	}
	done := make(chan postResult, 1)
	go func() {
		ids, _, err := p.post(ctx, 0, d)
		done <- postResult{ids, err}
	}()
	sample := func() error {
		res.SamplesAt = append(res.SamplesAt, time.Since(begin).Seconds())
		for i, pid := range pids {
			mib, err := rssMiB(pid)
			if err != nil {
				return fmt.Errorf("soak: %s (pid %d): %w", names[i], pid, err)
			}
			res.Samples[i] = append(res.Samples[i], mib)
		}
		return nil
	}
	if err := sample(); err != nil {
		return err
	}
	tick := time.NewTicker(interval)
	defer tick.Stop()
	var posted postResult
loop:
	for {
		select {
		case posted = <-done:
			break loop
		case <-tick.C:
			if err := sample(); err != nil {
				return err
			}
			if n := len(res.SamplesAt); n%12 == 1 {
				line := []string{}
				for i, name := range names {
					line = append(line, fmt.Sprintf("%s %.1f MiB", name, res.Samples[i][len(res.Samples[i])-1]))
				}
				progress("soak: %s: %s", time.Since(begin).Round(time.Second), strings.Join(line, ", "))
			}
		}
	}
	res.elapsed = time.Since(begin)
	if err := sample(); err != nil {
		return err
	}
	if posted.err != nil {
		return fmt.Errorf("soak: %w", posted.err)
	}
	sentAfter, err := p.sent(ctx)
	if err != nil {
		return err
	}
	res.Posted, res.Sent = int64(len(posted.ids)), sentAfter-sentBefore
	for i, name := range names {
		s := res.Samples[i]
		firstIdx := 0
		for firstIdx < len(s)-1 && res.SamplesAt[firstIdx] < warm.Seconds() {
			firstIdx++
		}
		r := serviceRSS{Name: name, Pid: pids[i], FirstMiB: s[firstIdx], LastMiB: s[len(s)-1]}
		for _, v := range s {
			r.MaxMiB = max(r.MaxMiB, v)
		}
		r.DriftPct = 100 * (r.LastMiB - r.FirstMiB) / r.FirstMiB
		res.Services = append(res.Services, r)
		row := &Row{Key: "rss_drift_" + name, Section: sec, Name: fmt.Sprintf("RSS drift %s over %s (first after %s warm-up → last)", name, d, warm),
			Value: r.DriftPct, Unit: "%", Details: map[string]any{"first_mib": r.FirstMiB, "last_mib": r.LastMiB, "max_mib": r.MaxMiB, "pid": r.Pid}}
		if name != stack.SMSProvider {
			row.Target = maxAbs(10, "%")
		}
		rep.add(row)
	}
	rep.add(&Row{Key: "soak_payments_per_s", Section: sec, Name: "soak: POST /v1/payments rate", Value: float64(res.Posted) / res.elapsed.Seconds(), Unit: "payments/s",
		Details: map[string]any{"posted": res.Posted}})
	rep.add(&Row{Key: "soak_sms_per_s", Section: sec, Name: "soak: SMS SENT rate (end-to-end drain)", Value: float64(res.Sent) / res.elapsed.Seconds(), Unit: "sms/s",
		Details: map[string]any{"sent": res.Sent, "backlog_at_end": res.Posted - res.Sent}})
	rep.Soak = res
	rep.note("soak: %d payments posted and %d SMS sent while it ran; %d not yet sent when it ended (in SQS, the inbox or PENDING).",
		res.Posted, res.Sent, max(0, res.Posted-res.Sent))
	rep.note("soak: smsprovider is the dev stand-in for the SMS vendor and keeps every delivered SMS (and every idempotency key) in memory by design, so its RSS grows with the number sent; it has no target.")
	return nil
}
