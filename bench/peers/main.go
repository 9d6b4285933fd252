// Command peers measures, for cmd/bench and on the same PostgreSQL and SQS
// servers, what users would pick instead of this library, one round per
// run, printing one JSON object:
//
//	peers -case watermill -rows N   Watermill's outbox: N rows in its SQL
//	                                table (watermill-sql), its Forwarder
//	                                publishing them to SQS; rows/s.
//	peers -case river -rows N       River: N jobs inserted with InsertTx in
//	                                the receiving transaction (8 at once),
//	                                workers running the rewards effect;
//	                                jobs/s and commit → effect p50.
//	peers -case river -rows N -rate R  the same, the jobs offered at R per
//	                                second (paced, under capacity): commit
//	                                → effect p50 and p99 at that load.
//
// It lives in a module of its own so that the library's module never
// depends on either peer. Each run makes its own database (and queue) and
// drops it afterwards.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"time"
)

type result struct {
	Case    string         `json:"case"`
	Count   int            `json:"count"`
	Seconds float64        `json:"seconds"`
	Rate    float64        `json:"rate"`
	P50ms   float64        `json:"p50_ms,omitempty"`
	P99ms   float64        `json:"p99_ms,omitempty"`
	Offered float64        `json:"offered_rate,omitempty"`
	Config  map[string]any `json:"config"`
}

func main() {
	which := flag.String("case", "", "watermill or river")
	rows := flag.Int("rows", 3000, "rows (watermill) or jobs (river) in the round")
	rate := flag.Float64("rate", 0, "river: offer the jobs at this many per second (0: as fast as the inserters go)")
	run := flag.String("run", "peers", "name prefix of the databases and queues")
	flag.Parse()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var res result
	var err error
	switch *which {
	case "watermill":
		res, err = watermillRound(ctx, *run, *rows)
	case "river":
		res, err = riverRound(ctx, *run, *rows, *rate)
	default:
		err = fmt.Errorf("-case: want watermill or river, got %q", *which)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "peers:", err)
		os.Exit(1)
	}
	_ = json.NewEncoder(os.Stdout).Encode(res)
}
