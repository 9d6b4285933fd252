package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/effectively-once/payments-cashback/internal/stack"
	"github.com/effectively-once/payments-cashback/pkg/events"
	"github.com/effectively-once/payments-cashback/pkg/outbox"
	"github.com/effectively-once/payments-cashback/services/contract"
	notificationsapp "github.com/effectively-once/payments-cashback/services/notifications/app"
	rewardsapp "github.com/effectively-once/payments-cashback/services/rewards/app"
)

// The drain measurements answer "how fast does a service catch up after an
// outage": a queue pre-filled with -drain-msgs valid events, then the real
// service process started on it (fresh database, fresh queues), timed from
// its start until the last effect committed (the last credit for rewards,
// the last SMS SENT for notifications, with the dev SMS provider answering
// at once). In the same rounds, on the same servers: a bare
// Receive(10)+DeleteMessageBatch loop draining as many messages, and the
// bare batched rewards transaction (10 messages per transaction, 8
// connections) over as many messages.

// drainPoll is how often a drain's progress is read. The end is the last
// effect's own timestamp (credited_at, sent_at), not the poll that saw it,
// so the interval costs no precision; each poll counts every row so far,
// load on the cores under measurement, so it is not frequent.
const drainPoll = 250 * time.Millisecond

// drainCase is one drain measurement of the interleaved rounds.
type drainCase struct {
	series
	run func(ctx context.Context, r int) (time.Duration, cpuUse, map[string]any, error)
}

func benchDrain(ctx context.Context, pg *pgEnv, sq *sqsEnv, o options, rep *report) error {
	const sec = "Drain: a pre-filled queue, the real service process, start → last effect"
	n := o.drainMsgs
	progress("drain: %d messages per measurement, %d interleaved rounds; building and starting the services", n, o.drainRounds)
	p, closeAll, err := startPipeline(ctx, pg, sq, o, "drain")
	if err != nil {
		return err
	}
	defer closeAll()
	// Only the process under measurement runs during a round: the idle
	// payments process and the services StartLocal started on the idle
	// databases are stopped; a second rewards replica is made once, then
	// stopped until a two-replica round starts it.
	for _, name := range []string{stack.Payments, stack.Rewards, stack.Notifications} {
		if err := p.local.Kill(name); err != nil {
			return err
		}
	}
	if err := p.local.StartAs("rewards-2", stack.Rewards); err != nil {
		return err
	}
	if err := p.local.Kill("rewards-2"); err != nil {
		return err
	}
	defer func() { cpu.extra = map[string]int{} }()

	rewardsDrain := func(replicas int) func(ctx context.Context, r int) (time.Duration, cpuUse, map[string]any, error) {
		return func(ctx context.Context, r int) (time.Duration, cpuUse, map[string]any, error) {
			tag := fmt.Sprintf("dr%d_rw%d", r, replicas)
			pool, drop, err := pg.freshDB(ctx, tag, 2)
			if err != nil {
				return 0, nil, nil, err
			}
			defer drop()
			if err := rewardsapp.Migrate(ctx, pool); err != nil {
				return 0, nil, nil, err
			}
			in, delIn, err := sq.queue(ctx, strings.ReplaceAll(tag, "_", "-")+"-in", 30*time.Second)
			if err != nil {
				return 0, nil, nil, err
			}
			defer delIn()
			out, delOut, err := sq.queue(ctx, strings.ReplaceAll(tag, "_", "-")+"-out", 30*time.Second)
			if err != nil {
				return 0, nil, nil, err
			}
			defer delOut()
			msgs, err := paymentEvents(n)
			if err != nil {
				return 0, nil, nil, err
			}
			if _, err := bareSend(ctx, sq.client, in, msgs, relayInFlight); err != nil {
				return 0, nil, nil, err
			}
			env := []string{"REWARDS_DATABASE_URL=" + pg.connString("bench_"+pg.run+"_"+tag),
				"PAYMENTS_QUEUE=" + queueName(in), "REWARDS_QUEUE=" + queueName(out)}
			names := []string{stack.Rewards, "rewards-2"}[:replicas]
			profiled, err := profileEnv(o, r, fmt.Sprintf("rewards-r%d", replicas))
			if err != nil {
				return 0, nil, nil, err
			}
			s0 := cpu.sample()
			start := time.Now()
			for i, name := range names {
				if err := p.local.StartNoWait(name, append(env, profiled.env(i == 0)...)...); err != nil {
					return 0, nil, nil, err
				}
				cpu.extra[name] = p.local.PID(name)
			}
			defer func() {
				for _, name := range names {
					_ = p.local.Kill(name)
					delete(cpu.extra, name)
				}
			}()
			defer profiled.take(ctx)() // before the kill: the profile comes from the live process
			var last time.Time
			err = waitUntil(ctx, 10*time.Minute, drainPoll, "every payment credited", func() (bool, error) {
				for _, name := range names {
					if !p.local.Running(name) {
						return false, fmt.Errorf("%s exited (%v); see %s", name, p.local.ExitState(name), p.local.LogPath(name))
					}
				}
				var c int64
				if err := pool.QueryRow(ctx, `SELECT count(*), coalesce(max(credited_at), now()) FROM cashback_credits`).Scan(&c, &last); err != nil {
					return false, err
				}
				return c >= int64(n), nil
			})
			use := s0.until(cpu.sample())
			if err != nil {
				return 0, nil, nil, err
			}
			var first time.Time
			if err := pool.QueryRow(ctx, `SELECT min(credited_at) FROM cashback_credits`).Scan(&first); err != nil {
				return 0, nil, nil, err
			}
			return last.Sub(start), use, map[string]any{"first_credit_after_start_s": first.Sub(start).Seconds()}, nil
		}
	}

	bareDrain := func(ctx context.Context, r int) (time.Duration, cpuUse, map[string]any, error) {
		q, del, err := sq.queue(ctx, fmt.Sprintf("dr%d-bare", r), 30*time.Second)
		if err != nil {
			return 0, nil, nil, err
		}
		defer del()
		msgs, err := paymentEvents(n)
		if err != nil {
			return 0, nil, nil, err
		}
		if _, err := bareSend(ctx, sq.client, q, msgs, relayInFlight); err != nil {
			return 0, nil, nil, err
		}
		var el time.Duration
		use, err := cpuOf(func() (err error) { el, err = bareReceiveDelete(ctx, sq.client, q, n, 1); return err })
		return el, use, nil, err
	}

	bareBatchTx := func(ctx context.Context, r int) (time.Duration, cpuUse, map[string]any, error) {
		const conns = 8
		pool, drop, err := setupRewardsDB(ctx, pg, fmt.Sprintf("dr%d_baretx", r), conns)
		if err != nil {
			return 0, nil, nil, err
		}
		defer drop()
		credits := make([]credit, n)
		for i := range credits {
			if credits[i], err = newCredit(); err != nil {
				return 0, nil, nil, err
			}
		}
		var el time.Duration
		use, err := cpuOf(func() error {
			var next atomic.Int64
			var wg sync.WaitGroup
			var once sync.Once
			var first error
			start := time.Now()
			for range conns {
				wg.Go(func() {
					for {
						i := int(next.Add(10)) - 10
						if i >= n || ctx.Err() != nil {
							return
						}
						if err := bareBatch(ctx, pool, credits[i:min(i+10, n)]); err != nil {
							once.Do(func() { first = err })
							return
						}
					}
				})
			}
			wg.Wait()
			el = time.Since(start)
			return first
		})
		return el, use, map[string]any{"connections": conns, "per_tx": 10}, err
	}

	nfsDrain := func(ctx context.Context, r int) (time.Duration, cpuUse, map[string]any, error) {
		tag := fmt.Sprintf("dr%d_nf", r)
		pool, drop, err := pg.freshDB(ctx, tag, 2)
		if err != nil {
			return 0, nil, nil, err
		}
		defer drop()
		if err := notificationsapp.Migrate(ctx, pool); err != nil {
			return 0, nil, nil, err
		}
		in, del, err := sq.queue(ctx, strings.ReplaceAll(tag, "_", "-")+"-in", 30*time.Second)
		if err != nil {
			return 0, nil, nil, err
		}
		defer del()
		msgs, err := creditedEvents(n)
		if err != nil {
			return 0, nil, nil, err
		}
		if _, err := bareSend(ctx, sq.client, in, msgs, relayInFlight); err != nil {
			return 0, nil, nil, err
		}
		env := []string{"NOTIFICATIONS_DATABASE_URL=" + pg.connString("bench_"+pg.run+"_"+tag), "REWARDS_QUEUE=" + queueName(in)}
		profiled, err := profileEnv(o, r, "notifications")
		if err != nil {
			return 0, nil, nil, err
		}
		s0 := cpu.sample()
		start := time.Now()
		if err := p.local.StartNoWait(stack.Notifications, append(env, profiled.env(true)...)...); err != nil {
			return 0, nil, nil, err
		}
		cpu.extra[stack.Notifications] = p.local.PID(stack.Notifications)
		defer func() { _ = p.local.Kill(stack.Notifications); delete(cpu.extra, stack.Notifications) }()
		defer profiled.take(ctx)() // before the kill: the profile comes from the live process
		var last time.Time
		err = waitUntil(ctx, 15*time.Minute, drainPoll, "every SMS SENT", func() (bool, error) {
			if !p.local.Running(stack.Notifications) {
				return false, fmt.Errorf("notifications exited (%v); see %s", p.local.ExitState(stack.Notifications), p.local.LogPath(stack.Notifications))
			}
			var c int64
			if err := pool.QueryRow(ctx, `SELECT count(*), coalesce(max(sent_at), now()) FROM notifications WHERE status = 'SENT'`).Scan(&c, &last); err != nil {
				return false, err
			}
			return c >= int64(n), nil
		})
		use := s0.until(cpu.sample())
		if err != nil {
			return 0, nil, nil, err
		}
		var stored time.Time
		if err := pool.QueryRow(ctx, `SELECT max(received_at) FROM inbox`).Scan(&stored); err != nil {
			return 0, nil, nil, err
		}
		return last.Sub(start), use, map[string]any{"last_inbox_store_after_start_s": stored.Sub(start).Seconds()}, nil
	}
	cpu.extra[stack.SMSProvider] = p.local.PID(stack.SMSProvider)

	cases := []*drainCase{
		{series: series{key: "drain_bare_recv1", name: "bare Receive(10)+DeleteBatch drain, 1 loop", unit: "msgs/s"}, run: bareDrain},
		{series: series{key: "drain_bare_batch_tx", name: "bare batched rewards tx (10/tx, 8 conns)", unit: "msgs/s"}, run: bareBatchTx},
		{series: series{key: "drain_rewards_r1", name: "rewards drain, 1 replica, start → last credit", unit: "msgs/s",
			base: "drain_bare_recv1", target: minRatio(0.5)}, run: rewardsDrain(1)},
		{series: series{key: "drain_rewards_r2", name: "rewards drain, 2 replicas, start → last credit", unit: "msgs/s",
			base: "drain_rewards_r1"}, run: rewardsDrain(2)},
		{series: series{key: "drain_notifications", name: "notifications drain, start → last SMS SENT", unit: "msgs/s"}, run: nfsDrain},
	}
	for r := range o.drainRounds {
		for _, c := range cases {
			el, use, d, err := c.run(ctx, r)
			if err != nil {
				return fmt.Errorf("%s, round %d: %w", c.name, r+1, err)
			}
			c.add(n, el, use)
			if d != nil {
				if c.details == nil {
					c.details = map[string]any{}
				}
				for k, v := range d {
					c.details[k] = append(asSlice(c.details[k]), v)
				}
			}
			progress("drain: round %d: %s: %.0f msgs/s", r+1, c.key, float64(n)/el.Seconds())
		}
	}
	for _, c := range cases {
		c.row(rep, sec)
	}
	r1 := rep.ref("drain_rewards_r1")
	rep.add(&Row{Key: "drain_rewards_r1_abs", Section: sec, Name: "rewards drain, 1 replica (absolute)", Value: r1.Value, Unit: "msgs/s",
		Rounds: r1.Rounds, Target: minValue(3000, "msgs/s")})
	rep.add(&Row{Key: "drain_rewards_r1_vs_batch_tx", Section: sec, Name: "rewards drain, 1 replica, vs the bare batched tx", Value: r1.Value, Unit: "msgs/s",
		Rounds: r1.Rounds, Baseline: rep.ref("drain_bare_batch_tx")})
	if o.notificationsBefore > 0 {
		nf := rep.ref("drain_notifications")
		rep.add(&Row{Key: "drain_notifications_vs_before", Section: sec,
			Name:  "notifications drain vs the drain before batching (-notifications-drain-before)",
			Value: nf.Value, Unit: "msgs/s", Rounds: nf.Rounds,
			Baseline: &Ref{Key: "before", Name: "notifications drain before batching", Value: o.notificationsBefore, Unit: "msgs/s"},
			Target:   minRatio(3)})
	}
	return nil
}

// profile is the -profile CPU profile of one drain: the service started
// with PPROF_ADDR on a free loopback port, and the profile fetched from it
// while it drains.
type profile struct {
	addr, path string
	secs       int
}

// profileEnv plans the profile of round r of the drain named name, or
// returns nil when -profile is off or r is not the first round.
func profileEnv(o options, r int, name string) (*profile, error) {
	if o.profileDir == "" || r != 0 {
		return nil, nil
	}
	if err := os.MkdirAll(o.profileDir, 0o755); err != nil {
		return nil, err
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	addr := l.Addr().String()
	_ = l.Close()
	return &profile{addr: addr, path: filepath.Join(o.profileDir, name+".pprof"), secs: o.profileSecs}, nil
}

// env is the environment that turns the service's profiles on (for the
// first replica only: one port).
func (p *profile) env(first bool) []string {
	if p == nil || !first {
		return nil
	}
	return []string{"PPROF_ADDR=" + p.addr}
}

// take fetches the CPU profile in the background, from as soon as the
// service answers, and then the allocations so far (alloc_space shows
// where the drain allocated); the returned func waits for both and reports
// where they went.
func (p *profile) take(ctx context.Context) (wait func()) {
	if p == nil {
		return func() {}
	}
	done := make(chan error, 1)
	go func() {
		cpuURL := fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", p.addr, p.secs)
		var resp *http.Response
		err := waitUntil(ctx, 30*time.Second, 10*time.Millisecond, "the service's pprof", func() (bool, error) {
			var err error
			resp, err = http.Get(cpuURL)
			return err == nil, nil
		})
		if err == nil {
			err = save(resp, p.path)
		}
		if err == nil {
			if resp, err = http.Get(fmt.Sprintf("http://%s/debug/pprof/allocs", p.addr)); err == nil {
				err = save(resp, strings.TrimSuffix(p.path, ".pprof")+".allocs.pprof")
			}
		}
		done <- err
	}()
	return func() {
		if err := <-done; err != nil {
			progress("profile %s: %v", p.path, err)
			return
		}
		progress("profile: go tool pprof %s (and .allocs.pprof)", p.path)
	}
}

// save writes a pprof response's body to path.
func save(resp *http.Response, path string) error {
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("pprof: %s", resp.Status)
	}
	b, err := io.ReadAll(resp.Body)
	if err == nil {
		err = os.WriteFile(path, b, 0o644)
	}
	return err
}

func asSlice(v any) []any {
	s, _ := v.([]any)
	return s
}

// bareBatch is the bare rewards transaction for several messages at once:
// one multi-row dedupe INSERT, then each message's credit and wallet move.
func bareBatch(ctx context.Context, pool *pgxpool.Pool, crs []credit) error {
	ids := make([]uuid.UUID, len(crs))
	hashes := make([][]byte, len(crs))
	for i, c := range crs {
		ids[i], hashes[i] = c.msg.EventID, c.msg.Hash
	}
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `INSERT INTO processed_messages (consumer, message_id, payload_hash)
			SELECT $1, id, h FROM unnest($2::uuid[], $3::bytea[]) AS k(id, h) ON CONFLICT DO NOTHING`, consumerName, ids, hashes)
		if err != nil {
			return err
		}
		if tag.RowsAffected() != int64(len(crs)) {
			return fmt.Errorf("fresh ids: %d of %d inserted", tag.RowsAffected(), len(crs))
		}
		// Wallets in user order, as the library's batch path moves them:
		// concurrent batches then never deadlock on each other's wallets.
		for _, c := range slices.SortedFunc(slices.Values(crs), func(a, b credit) int { return cmp.Compare(a.user, b.user) }) {
			if err := c.apply(ctx, tx); err != nil {
				return err
			}
		}
		return nil
	})
}

// paymentEvents are n valid PaymentSucceeded events as the payments relay
// publishes them, for distinct payments of 10,000 users.
func paymentEvents(n int) ([]outbox.Message, error) {
	return eventMessages(n, func(i int) (events.Envelope, error) {
		pay := "pay_" + strings.ReplaceAll(uuid.Must(uuid.NewV7()).String(), "-", "")
		return events.New(contract.PaymentSucceeded, pay, 1, map[string]any{"payment_id": pay,
			"user_id": fmt.Sprintf("u_drain_%d", rand.IntN(10000)), "amount_paise": 120000, "currency": "INR", "status": "SUCCEEDED"})
	})
}

// creditedEvents are n valid CashbackCredited events as rewards' relay
// publishes them.
func creditedEvents(n int) ([]outbox.Message, error) {
	return eventMessages(n, func(i int) (events.Envelope, error) {
		pay := "pay_" + strings.ReplaceAll(uuid.Must(uuid.NewV7()).String(), "-", "")
		user := fmt.Sprintf("u_drain_%d", rand.IntN(10000))
		return events.New(contract.CashbackCredited, pay, 1, map[string]any{"payment_id": pay, "user_id": user,
			"amount_paise": 2400, "rate_bp": 200, "payment_amount_paise": 120000, "currency": "INR", "recipient": user,
			"source_event_id": uuid.Must(uuid.NewV7()).String()})
	})
}

func eventMessages(n int, mk func(i int) (events.Envelope, error)) ([]outbox.Message, error) {
	msgs := make([]outbox.Message, n)
	for i := range msgs {
		e, err := mk(i)
		if err != nil {
			return nil, err
		}
		body, err := e.Marshal()
		if err != nil {
			return nil, err
		}
		msgs[i] = outbox.Message{EventID: e.EventID, Body: body, Attributes: map[string]string{
			"event_id": e.EventID.String(), "event_type": e.EventType,
			"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}}
	}
	return msgs, nil
}
