package e2e

import (
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/effectively-once/payments-cashback/internal/faults"
)

// The soak's network: every service reaches PostgreSQL, SQS and (for
// notifications) the SMS provider through a Toxiproxy proxy of its own kind
// (the replicas of a kind share it), so the controller can make one link
// misbehave at a time.

// soakReplicas is SOAK_REPLICAS (default 2): how many of each process run.
func soakReplicas(t *testing.T) int {
	if v := os.Getenv("SOAK_REPLICAS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 5 {
			t.Fatalf("SOAK_REPLICAS=%q: want 1 to 5", v)
		}
		return n
	}
	return 2
}

// soakLink is one proxied link: a service kind to one dependency.
type soakLink struct {
	name string // "rewards → db"
	kind string // db, sqs, sms
	px   *faults.Proxy
}

type soakNet struct {
	links []*soakLink
	env   map[string][]string // service kind → its KEY=URL entries through the proxies
}

// newSoakNet starts the proxies of payments, rewards and notifications.
func newSoakNet(t *testing.T) *soakNet {
	n := &soakNet{env: map[string][]string{}}
	for _, svc := range []struct{ name, db string }{
		{"payments", "PAYMENTS_DATABASE_URL"}, {"rewards", "REWARDS_DATABASE_URL"}, {"notifications", "NOTIFICATIONS_DATABASE_URL"}} {
		deps := []struct{ kind, key string }{{"db", svc.db}, {"sqs", "AWS_ENDPOINT_URL"}}
		if svc.name == "notifications" {
			deps = append(deps, struct{ kind, key string }{"sms", "SMS_PROVIDER_URL"})
		}
		for _, d := range deps {
			px, entry := viaProxy(t, d.key)
			n.links = append(n.links, &soakLink{name: svc.name + " → " + d.kind, kind: d.kind, px: px})
			n.env[svc.name] = append(n.env[svc.name], entry)
		}
	}
	return n
}

// pick is a random link among those whose name is in names (all if none).
func (n *soakNet) pick(rng *rand.Rand, names ...string) *soakLink {
	var c []*soakLink
	for _, l := range n.links {
		for _, want := range names {
			if l.name == want {
				c = append(c, l)
			}
		}
	}
	if len(names) == 0 {
		c = n.links
	}
	return c[rng.IntN(len(c))]
}

// soakFault is one kind of network misbehaviour the controller injects.
type soakFault struct {
	name  string
	apply func(rng *rand.Rand, n *soakNet) (*soakLink, faults.Toxic)
}

var soakFaults = []soakFault{
	{"latency 100-500 ms with jitter", func(rng *rand.Rand, n *soakNet) (*soakLink, faults.Toxic) {
		return n.pick(rng), faults.Latency(time.Duration(100+rng.IntN(400))*time.Millisecond, time.Duration(50+rng.IntN(100))*time.Millisecond)
	}},
	{"connections reset mid-transaction", func(rng *rand.Rand, n *soakNet) (*soakLink, faults.Toxic) {
		return n.pick(rng, "payments → db", "rewards → db", "notifications → db"), faults.Reset(time.Duration(rng.IntN(100)) * time.Millisecond)
	}},
	{"connection cut right after COMMIT", func(rng *rand.Rand, n *soakNet) (*soakLink, faults.Toxic) {
		return n.pick(rng, "payments → db", "rewards → db", "notifications → db"), faults.CutOnReply("COMMIT\x00", 1+rng.IntN(2))
	}},
	{"SendMessageBatch response lost", func(rng *rand.Rand, n *soakNet) (*soakLink, faults.Toxic) {
		return n.pick(rng, "payments → sqs", "rewards → sqs"), faults.CutOnReply("MD5OfMessageBody", 1+rng.IntN(2))
	}},
	{"DeleteMessageBatch response lost", func(rng *rand.Rand, n *soakNet) (*soakLink, faults.Toxic) {
		return n.pick(rng, "rewards → sqs", "notifications → sqs"), faults.CutOnReply(`"Successful"`, 1+rng.IntN(2), "MD5OfMessageBody")
	}},
	{"bandwidth of a few KB/s", func(rng *rand.Rand, n *soakNet) (*soakLink, faults.Toxic) {
		return n.pick(rng), faults.Bandwidth(2 + rng.IntN(6))
	}},
	{"slow SMS provider (1-3 s)", func(rng *rand.Rand, n *soakNet) (*soakLink, faults.Toxic) {
		return n.pick(rng, "notifications → sms"), faults.Latency(time.Duration(1000+rng.IntN(2000))*time.Millisecond, 200*time.Millisecond)
	}},
	{"SMS provider accepts, then drops the connection", func(rng *rand.Rand, n *soakNet) (*soakLink, faults.Toxic) {
		return n.pick(rng, "notifications → sms"), faults.CutOnReply(`"message_id"`, 1+rng.IntN(2))
	}},
}

// inject applies one random fault for hold, then removes it, and counts it.
func (n *soakNet) inject(t *testing.T, rng *rand.Rand, st *soakStats, hold time.Duration) {
	f := soakFaults[rng.IntN(len(soakFaults))]
	link, toxic := f.apply(rng, n)
	name, err := link.px.Add(toxic)
	if err != nil {
		t.Fatalf("soak: %s on %s: %v", f.name, link.name, err)
	}
	time.Sleep(hold)
	if err := link.px.Remove(name); err != nil {
		t.Fatalf("soak: remove %s from %s: %v", f.name, link.name, err)
	}
	if st.faults == nil {
		st.faults = map[string]int{}
	}
	st.faults[f.name]++
}

// partition cuts one service kind from its database for d, sampling the
// queues' backlog meanwhile.
func (n *soakNet) partition(t *testing.T, rng *rand.Rand, st *soakStats, d time.Duration) {
	link := n.pick(rng, "rewards → db", "notifications → db", "payments → db")
	backlog := func() int { return depth(t, s.payQ) + depth(t, s.rewQ) }
	b0 := backlog()
	peak := b0
	link.px.Cut()
	fmt.Printf("soak: %s partitioned for %v\n", link.name, d.Round(time.Second))
	for end := time.Now().Add(d); time.Now().Before(end); {
		time.Sleep(time.Second)
		peak = max(peak, backlog())
	}
	if err := link.px.Restore(); err != nil {
		t.Fatal(err)
	}
	st.partition = fmt.Sprintf("%s for %v; queue backlog %d → peak %d", link.name, d.Round(time.Second), b0, peak)
}

// partitionLength is 60-120 s in a soak of 10 minutes or more, and a tenth
// to a fifth of a shorter one (at least 5 s), so make test's soak stays quick.
func partitionLength(rng *rand.Rand, total time.Duration) time.Duration {
	lo, hi := 60*time.Second, 120*time.Second
	if total < 10*time.Minute {
		lo, hi = max(total/10, 5*time.Second), max(total/5, 6*time.Second)
	}
	return lo + time.Duration(rng.Int64N(int64(hi-lo)))
}
