package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"sync/atomic"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/effectively-once/payments-cashback/internal/testenv"
	"github.com/effectively-once/payments-cashback/pkg/idempotent"
)

// env is the servers of one run, each with a counter of the round trips
// made to it.
type env struct {
	run     string
	admin   *pgxpool.Pool
	dbName  string
	pool    *pgxpool.Pool
	dynamo  *dynamodb.Client // nil without moto
	rdb     *redis.Client    // nil without Redis
	skipped []string

	pgTrips, dyTrips, redisTrips atomic.Int64
	stops                        []func()
}

func newEnv(ctx context.Context, run string) (*env, error) {
	e := &env{run: run}
	cfg, err := pgxpool.ParseConfig(os.Getenv("DATABASE_URL"))
	if err != nil {
		return nil, fmt.Errorf("DATABASE_URL: %w", err)
	}
	acfg := cfg.Copy()
	acfg.MaxConns = 1
	if e.admin, err = pgxpool.NewWithConfig(ctx, acfg); err != nil {
		return nil, err
	}
	e.dbName = "bench_stores_" + run
	if _, err := e.admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{e.dbName}.Sanitize()); err != nil {
		e.admin.Close()
		return nil, err
	}
	e.stops = append(e.stops, func() {
		_, _ = e.admin.Exec(context.Background(), "DROP DATABASE IF EXISTS "+pgx.Identifier{e.dbName}.Sanitize()+" WITH (FORCE)")
		e.admin.Close()
	})
	cfg.ConnConfig.Database = e.dbName
	cfg.MaxConns = 8
	cfg.ConnConfig.Tracer = pgCounter{&e.pgTrips}
	if e.pool, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
		e.close()
		return nil, err
	}
	e.stops = append(e.stops, e.pool.Close)
	if err := idempotent.Migrate(ctx, e.pool); err != nil {
		e.close()
		return nil, err
	}

	if ep := os.Getenv("MOTO_ENDPOINT_URL"); ep != "" {
		e.dynamo = e.dynamoClient(ep)
	} else if proc, ep, err := testenv.StartMoto(); err != nil {
		e.skipped = append(e.skipped, "DynamoDB: "+err.Error())
	} else {
		e.stops = append(e.stops, proc.Stop)
		e.dynamo = e.dynamoClient(ep)
	}

	addr := os.Getenv("REDIS_ADDR")
	if addr == "" {
		r, err := testenv.StartRedis()
		if err != nil {
			e.skipped = append(e.skipped, "Redis pre-filter: "+err.Error())
		} else {
			e.stops = append(e.stops, r.Stop)
			addr = r.Addr
		}
	}
	if addr != "" {
		e.rdb = redis.NewClient(&redis.Options{Addr: addr, PoolSize: 16})
		e.rdb.AddHook(redisCounter{&e.redisTrips})
		e.stops = append(e.stops, func() { _ = e.rdb.Close() })
	}
	return e, nil
}

func (e *env) close() {
	for i := len(e.stops) - 1; i >= 0; i-- {
		e.stops[i]()
	}
	e.stops = nil
}

// dynamoClient counts every HTTP request, so every DynamoDB call and every
// SDK retry, as a round trip.
func (e *env) dynamoClient(endpoint string) *dynamodb.Client {
	return dynamodb.New(dynamodb.Options{
		Region: "us-east-1", BaseEndpoint: aws.String(endpoint),
		Credentials: credentials.NewStaticCredentialsProvider("test", "test", ""),
		HTTPClient:  &http.Client{Transport: countingRT{awshttp.NewBuildableClient().GetTransport(), &e.dyTrips}},
	})
}

type countingRT struct {
	next http.RoundTripper
	n    *atomic.Int64
}

func (c countingRT) RoundTrip(r *http.Request) (*http.Response, error) {
	c.n.Add(1)
	return c.next.RoundTrip(r)
}

// pgCounter counts statements and batches (a batch is one round trip).
type pgCounter struct{ n *atomic.Int64 }

func (p pgCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	p.n.Add(1)
	return ctx
}
func (pgCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (p pgCounter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	p.n.Add(1)
	return ctx
}
func (pgCounter) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (pgCounter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

// redisCounter counts commands and pipelines.
type redisCounter struct{ n *atomic.Int64 }

func (redisCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (r redisCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { r.n.Add(1); return next(ctx, cmd) }
}
func (r redisCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { r.n.Add(1); return next(ctx, cmds) }
}
