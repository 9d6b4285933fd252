package stack

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/effectively-once/payments-cashback/internal/sysproc"
	"github.com/effectively-once/payments-cashback/internal/testenv"
)

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) != "" {
		parentDeathHelper()
		return
	}
	testenv.Main(m)
}

func TestLoadEnv(t *testing.T) {
	root := t.TempDir()
	if _, err := LoadEnv(root); !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), "scripts/stack.sh with") {
		t.Fatalf("LoadEnv without .stack/env = %v, want fs.ErrNotExist saying how to get one", err)
	}
	if err := os.MkdirAll(filepath.Join(root, ".stack"), 0o755); err != nil {
		t.Fatal(err)
	}
	file := "# Written by scripts/stack.sh\n" +
		"export DATABASE_URL='postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable'\n" +
		"export QUOTED='it'\\''s'\n" +
		"\n" +
		"PLAIN=x=y\n"
	if err := os.WriteFile(filepath.Join(root, ".stack", "env"), []byte(file), 0o644); err != nil {
		t.Fatal(err)
	}
	env, err := LoadEnv(root)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"DATABASE_URL": "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable",
		"QUOTED":       "it's",
		"PLAIN":        "x=y",
	}
	if fmt.Sprint(env) != fmt.Sprint(want) {
		t.Fatalf("LoadEnv = %v, want %v", env, want)
	}
	if _, err := parseEnv("f", []byte("export 'bad\n")); err == nil || !strings.Contains(err.Error(), "f:1") {
		t.Fatalf("parseEnv of a bad line = %v, want an error naming f:1", err)
	}
}

func TestRepoRoot(t *testing.T) {
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "internal", "stack", "stack.go")); err != nil {
		t.Fatalf("RepoRoot = %s, which has no internal/stack: %v", root, err)
	}
}

// hermeticEnv is a stack environment of its own: fresh databases and queues
// on the test servers (testenv: .stack/env's, or ones it starts) and free
// ports, so this test can run while a demo or the e2e suite uses the
// default ports and queues.
func hermeticEnv(t *testing.T) map[string]string {
	t.Helper()
	c := testenv.SQS(t) // sets AWS_ENDPOINT_URL in this process if it started fauxqs
	pq, _ := testenv.Queue(t, c, 5, 30*time.Second)
	rq, _ := testenv.Queue(t, c, 5, 30*time.Second)
	endpoint := os.Getenv("AWS_ENDPOINT_URL")
	if endpoint == "" {
		env, err := LoadEnv(mustRoot(t))
		if err != nil {
			t.Fatal(err)
		}
		endpoint = env["AWS_ENDPOINT_URL"]
	}
	env := map[string]string{
		"PAYMENTS_DATABASE_URL":      testenv.DatabaseURL(t),
		"REWARDS_DATABASE_URL":       testenv.DatabaseURL(t),
		"NOTIFICATIONS_DATABASE_URL": testenv.DatabaseURL(t),
		"AWS_ENDPOINT_URL":           endpoint,
		"STRIPE_URL":                 testenv.StripeMock(t),
		"PAYMENTS_QUEUE":             pq[strings.LastIndex(pq, "/")+1:],
		"REWARDS_QUEUE":              rq[strings.LastIndex(rq, "/")+1:],
		"QUEUE_WAIT":                 "10s",
		// A stop waits for the consumer's current long poll (an abandoned
		// poll would hide what it receives), so polls of the default 20 s
		// would make every Stop here take 20 s.
		"SUBSCRIBER_WAIT_TIME": "1s",
	}
	choosePorts(t, env)
	return env
}

// choosePorts gives every service a free loopback port in env.
func choosePorts(t *testing.T, env map[string]string) {
	t.Helper()
	for _, name := range Services {
		env[bases[name].urlVar] = "http://127.0.0.1:" + strconv.Itoa(mustFreePort(t))
	}
}

// startLocal is StartLocal on env, choosing the services' ports again
// when one hermeticEnv chose was taken before the stack could bind it:
// other test processes (a moto, a fauxqs) pick from the same range. The
// refusal itself is TestPortInUse's.
func startLocal(ctx context.Context, t *testing.T, env map[string]string) *Local {
	t.Helper()
	for attempt := 1; ; attempt++ {
		l, err := StartLocal(ctx, Options{Env: env, LogDir: t.TempDir()})
		var pe *PortInUseError
		if errors.As(err, &pe) && attempt < 3 {
			t.Logf("%v: choosing the ports again", err)
			choosePorts(t, env)
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
}

func mustRoot(t *testing.T) string {
	t.Helper()
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return root
}

func mustFreePort(t *testing.T) int {
	t.Helper()
	p, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func get(t *testing.T, u string) int {
	t.Helper()
	resp, err := http.Get(u)
	if err != nil {
		t.Fatalf("GET %s: %v", u, err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

func requireReady(t *testing.T, l *Local, name string) {
	t.Helper()
	path := "/readyz"
	if l.procs[name].base == SMSProvider {
		path = "/healthz"
	}
	if code := get(t, l.URL(name)+path); code != http.StatusOK {
		t.Fatalf("%s %s = %d, want 200", name, path, code)
	}
}

func portFree(port int) bool {
	c, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(port), 200*time.Millisecond)
	if err == nil {
		c.Close()
		return false
	}
	return true
}

// gone reports whether the process with this pid has died: no such
// process, or a zombie waiting for a reaper (in a container PID 1 may never
// reap the orphans of a killed parent).
func gone(pid int) bool {
	if !sysproc.Alive(pid) {
		return true
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	// pid (comm) S ...: the state follows the last ')'.
	rest := string(b[strings.LastIndexByte(string(b), ')')+1:])
	return strings.HasPrefix(strings.TrimSpace(rest), "Z")
}

func TestLocal(t *testing.T) {
	env := hermeticEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	t0 := time.Now()
	l := startLocal(ctx, t, env)
	t.Cleanup(func() { _ = l.Close() }) // before the databases are dropped (cleanups run last-in first-out)
	t.Logf("StartLocal (build + 4 processes ready): %v", time.Since(t0).Round(time.Millisecond))

	for _, name := range Services {
		if !l.Running(name) {
			t.Fatalf("%s not running after StartLocal", name)
		}
		requireReady(t, l, name)
		if want := env[bases[name].urlVar]; l.URL(name) != want {
			t.Fatalf("URL(%s) = %s, want %s (from the env)", name, l.URL(name), want)
		}
		// Loopback only: the HTTP task is named by the address it binds.
		b, _ := os.ReadFile(l.LogPath(name))
		if want := fmt.Sprintf(`"task":"http 127.0.0.1:%d"`, l.Port(name)); !strings.Contains(string(b), want) {
			t.Errorf("%s's log has no %s: it does not bind loopback only", name, want)
		}
	}
	// The read routes need the dev keys StartLocal made.
	req, _ := http.NewRequest(http.MethodGet, l.URL(Rewards)+"/v1/cashback-rates", nil)
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("rates without a key: %v %v, want 401", resp, err)
	}
	req.Header.Set("Authorization", "Bearer "+l.Key("REWARDS_READ_KEY"))
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusOK {
		t.Errorf("rates with REWARDS_READ_KEY: %v %v, want 200", resp, err)
	}

	// Kill: SIGKILL, gone, port free, exit by signal.
	pid := l.PID(Rewards)
	if err := l.Kill(Rewards); err != nil {
		t.Fatal(err)
	}
	if l.Running(Rewards) || !gone(pid) || !portFree(l.Port(Rewards)) {
		t.Fatalf("after Kill: running=%v gone=%v portFree=%v", l.Running(Rewards), gone(pid), portFree(l.Port(Rewards)))
	}
	if sig, err := l.WaitExit(Rewards, time.Second); err != nil || !sig {
		t.Fatalf("WaitExit after Kill = %v, %v; want killed by a signal", sig, err)
	}
	if err := l.Kill(Rewards); err != nil {
		t.Fatalf("Kill of an exited process = %v, want nil", err)
	}

	// Start again, with extra env for this run.
	t1 := time.Now()
	if err := l.Start(Rewards, "LOG_LEVEL=debug"); err != nil {
		t.Fatal(err)
	}
	t.Logf("rewards restart to ready: %v", time.Since(t1).Round(time.Millisecond))
	requireReady(t, l, Rewards)
	if l.PID(Rewards) == pid {
		t.Fatal("Start reused the old pid")
	}
	if err := l.Start(Rewards); err == nil || !strings.Contains(err.Error(), "already running") {
		t.Fatalf("Start of a running process = %v, want 'already running'", err)
	}

	// Replicas: a port of the kernel's choosing, or the one given.
	if err := l.StartAs("rewards-2", Rewards); err != nil {
		t.Fatal(err)
	}
	requireReady(t, l, "rewards-2")
	if l.Port("rewards-2") == l.Port(Rewards) || l.Port("rewards-2") == 0 {
		t.Fatalf("rewards-2 port %d (rewards has %d)", l.Port("rewards-2"), l.Port(Rewards))
	}
	relayPort := mustFreePort(t)
	if err := l.StartAs("payments-relay", Payments, "ROLE=relay", "PORT="+strconv.Itoa(relayPort)); err != nil {
		t.Fatal(err)
	}
	if l.Port("payments-relay") != relayPort {
		t.Fatalf("payments-relay port = %d, want %d", l.Port("payments-relay"), relayPort)
	}
	requireReady(t, l, "payments-relay")
	if err := l.StartAs("bogus", "nope"); err == nil {
		t.Fatal("StartAs of an unknown binary succeeded")
	}

	// Stop: SIGTERM, a clean exit; Start brings the replica back with its env.
	if err := l.Stop("payments-relay"); err != nil {
		t.Fatal(err)
	}
	if st := l.ExitState("payments-relay"); st == nil || !st.Success() {
		t.Fatalf("payments-relay after Stop: %v, want a clean exit", st)
	}
	if sig, err := l.WaitExit("payments-relay", time.Second); err != nil || sig {
		t.Fatalf("WaitExit after Stop = %v, %v; want a normal exit", sig, err)
	}
	if err := l.Start("payments-relay"); err != nil {
		t.Fatal(err)
	}
	if l.Port("payments-relay") != relayPort {
		t.Fatalf("payments-relay came back on port %d, want %d", l.Port("payments-relay"), relayPort)
	}

	// A running replica's name is taken; once it is stopped, a later
	// scenario may reuse the name with other settings.
	if err := l.StartAs("rewards-2", Rewards, "LOG_LEVEL=debug"); err == nil || !strings.Contains(err.Error(), "running") {
		t.Fatalf("StartAs of a running name with another env = %v, want refused", err)
	}
	if err := l.Stop("rewards-2"); err != nil {
		t.Fatal(err)
	}
	if err := l.StartAs("rewards-2", Rewards, "LOG_LEVEL=debug"); err != nil {
		t.Fatalf("StartAs of a stopped name with another env: %v", err)
	}
	requireReady(t, l, "rewards-2")

	// A process that dies on start: the error carries its log.
	if err := l.Kill(Notifications); err != nil {
		t.Fatal(err)
	}
	err := l.Start(Notifications, "SENDING_POLICY_CASHBACK=bogus")
	if err == nil || !strings.Contains(err.Error(), "exited while starting") || !strings.Contains(err.Error(), "bogus") {
		t.Fatalf("Start with a bad config = %v, want 'exited while starting' with the log", err)
	}
	if err := l.StartNoWait(Notifications); err != nil {
		t.Fatal(err)
	}
	if err := l.Restart(Notifications); err != nil {
		t.Fatal(err)
	}
	requireReady(t, l, Notifications)

	logText, err := os.ReadFile(l.LogPath(Rewards))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"msg":"stack: starting"`, `"msg":"stack: exited"`, `"service":"rewards"`, `LOG_LEVEL=debug`} {
		if !strings.Contains(string(logText), want) {
			t.Fatalf("rewards log lacks %s:\n%s", want, logText)
		}
	}

	// Close: everything gone, every port free.
	pids := map[string]int{}
	for _, name := range l.Names() {
		pids[name] = l.PID(name)
	}
	t2 := time.Now()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	t.Logf("Close: %v", time.Since(t2).Round(time.Millisecond))
	for name, pid := range pids {
		if l.Running(name) || !gone(pid) || !portFree(l.Port(name)) {
			t.Errorf("%s after Close: running=%v gone=%v portFree=%v", name, l.Running(name), gone(pid), portFree(l.Port(name)))
		}
	}
	if err := l.Start(Rewards); err == nil {
		t.Fatal("Start after Close succeeded")
	}
}

func TestPortInUse(t *testing.T) {
	env := hermeticEnv(t)
	ln, err := net.Listen("tcp", ":0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	env["PAYMENTS_URL"] = "http://127.0.0.1:" + strconv.Itoa(port)
	_, err = StartLocal(context.Background(), Options{Env: env, LogDir: t.TempDir()})
	var pe *PortInUseError
	if !errors.As(err, &pe) || pe.Port != port || pe.Name != Payments {
		t.Fatalf("StartLocal with port %d taken = %v, want a PortInUseError for payments", port, err)
	}
	want := fmt.Sprintf("port %d (payments) is in use by pid %d (", port, os.Getpid())
	// The way out: for make demo and make e2e, scripts/stack.sh's
	// PAYMENTS_PORT (it writes .stack/env's PAYMENTS_URL, which they read);
	// for a program of its own, PAYMENTS_URL in Options.Env.
	for _, way := range []string{"PAYMENTS_PORT=<port> make demo", "PAYMENTS_URL in Options.Env"} {
		if !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), way) {
			t.Fatalf("error %q, want it to contain %q and the way out (%s)", err, want, way)
		}
	}
	// Nothing was started: the other ports are still free.
	for _, name := range []string{SMSProvider, Rewards, Notifications} {
		u := env[bases[name].urlVar]
		p, _ := strconv.Atoi(u[strings.LastIndex(u, ":")+1:])
		if !portFree(p) {
			t.Errorf("%s's port %d is taken after a failed StartLocal", name, p)
		}
	}
}

// TestParentDeath: a program holding a Local that dies without cleaning up
// (SIGKILL) leaves no service behind.
func TestParentDeath(t *testing.T) {
	if !sysproc.DiesWithParent {
		t.Skip("no parent-death signal on this OS")
	}
	env := hermeticEnv(t)
	b, _ := json.Marshal(env)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"="+string(b), helperLogsEnv+"="+t.TempDir())
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	var pids map[string]int
	if err := json.NewDecoder(out).Decode(&pids); err != nil {
		t.Fatalf("helper: %v", err)
	}
	if len(pids) != len(Services) {
		t.Fatalf("helper started %v", pids)
	}
	for name, pid := range pids {
		if gone(pid) {
			t.Fatalf("%s (pid %d) is not running before the parent dies", name, pid)
		}
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	_ = cmd.Wait()
	deadline := time.Now().Add(10 * time.Second)
	for name, pid := range pids {
		for !gone(pid) {
			if time.Now().After(deadline) {
				t.Fatalf("%s (pid %d) outlived its killed parent", name, pid)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	for _, name := range Services {
		u := env[bases[name].urlVar]
		p, _ := strconv.Atoi(u[strings.LastIndex(u, ":")+1:])
		for !portFree(p) {
			if time.Now().After(deadline) {
				t.Fatalf("%s's port %d still taken after its parent died", name, p)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

const (
	helperEnv     = "STACK_TEST_PARENT_DEATH_ENV"
	helperLogsEnv = "STACK_TEST_PARENT_DEATH_LOGS"
)

// parentDeathHelper is the child of TestParentDeath: it starts a stack,
// prints the pids and waits to be killed.
func parentDeathHelper() {
	var env map[string]string
	if err := json.Unmarshal([]byte(os.Getenv(helperEnv)), &env); err != nil {
		fmt.Fprintln(os.Stderr, "helper:", err)
		os.Exit(2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	l, err := StartLocal(ctx, Options{Env: env, LogDir: os.Getenv(helperLogsEnv)})
	if err != nil {
		fmt.Fprintln(os.Stderr, "helper:", err)
		os.Exit(2)
	}
	pids := map[string]int{}
	for _, name := range Services {
		pids[name] = l.PID(name)
	}
	_ = json.NewEncoder(os.Stdout).Encode(pids)
	time.Sleep(time.Hour)
}

// A stack started without keys gets one fresh key per dev client, every
// *_API_KEYS a service needs, loopback binds and stripe-mock's fixtures;
// what the caller set stays, and the caller's map is not touched.
func TestDevDefaultsFillOnlyWhatIsMissing(t *testing.T) {
	in := map[string]string{"PAYMENTS_API_KEYS": "web:k", "PAYMENTS_API_KEY": "k", "LISTEN_ADDR": "::1"}
	out := withDevDefaults(in)
	if len(in) != 3 {
		t.Errorf("the caller's map changed: %v", in)
	}
	if out["PAYMENTS_API_KEYS"] != "web:k" || out["PAYMENTS_API_KEY"] != "k" || out["LISTEN_ADDR"] != "::1" || out["STRIPE_MOCK_FIXTURES"] != "true" {
		t.Errorf("defaults overrode the caller or missed one: %v", out)
	}
	for _, c := range DevClients[1:] {
		k := out[c.KeyVar]
		if len(k) < 32 || !strings.Contains(out[c.KeysVar], c.Entry+":"+k) {
			t.Errorf("%s = %q not in %s = %q", c.KeyVar, k, c.KeysVar, out[c.KeysVar])
		}
	}
	if withDevDefaults(map[string]string{})["LISTEN_ADDR"] != "127.0.0.1" {
		t.Error("no LISTEN_ADDR default of 127.0.0.1")
	}
}

// Of the caller's environment a service gets the Go runtime's own knobs
// (a GOMEMLIMIT set for a run reaches every service) and never a stray
// setting of a service's (FAILPOINTS, a port).
func TestServicesInheritTheRuntimeKnobsAndNoStraySettings(t *testing.T) {
	for k, v := range map[string]string{"GOGC": "200", "GOMEMLIMIT": "512MiB", "GOMAXPROCS": "1", "GODEBUG": "gctrace=0",
		"FAILPOINTS": "after-publish-before-mark", "REWARDS_PORT": "1", "LOG_LEVEL": "debug"} {
		t.Setenv(k, v)
	}
	l := &Local{env: map[string]string{}, procs: map[string]*proc{}}
	env, _, err := l.environ(&proc{name: Rewards, base: Rewards}, nil)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		got[k] = v
	}
	for k, v := range map[string]string{"GOGC": "200", "GOMEMLIMIT": "512MiB", "GOMAXPROCS": "1", "GODEBUG": "gctrace=0"} {
		if got[k] != v {
			t.Errorf("%s = %q in the service's environment, want %q from the caller's", k, got[k], v)
		}
	}
	for _, k := range []string{"FAILPOINTS", "LOG_LEVEL"} {
		if _, ok := got[k]; ok {
			t.Errorf("the caller's %s reached the service", k)
		}
	}
}
