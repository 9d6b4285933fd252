package testenv

import (
	"errors"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// RedisServer is a redis-server of its own, empty, without persistence,
// that a test can stop and start again on the same port (Redis down, Redis
// restarted with nothing in it).
type RedisServer struct {
	Addr string // 127.0.0.1:port
	bin  string
	port int
	proc *child
	out  *Buffer
}

// Redis starts a redis-server for this test on a free port and stops it at
// the end of the test. The test is skipped, with the reason, where
// redis-server is not installed.
func Redis(t testing.TB) *RedisServer {
	t.Helper()
	r, err := StartRedis()
	if errors.Is(err, exec.ErrNotFound) {
		t.Skipf("redis unavailable: %v", err)
	}
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	t.Cleanup(r.Stop)
	return r
}

// StartRedis starts `redis-server --port P --save ” --appendonly no` on a
// free loopback port and waits until it accepts connections.
func StartRedis() (*RedisServer, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, fmt.Errorf("no redis-server on PATH (apt-get install redis-server): %w", err)
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	r := &RedisServer{Addr: "127.0.0.1:" + strconv.Itoa(port), bin: bin, port: port}
	return r, r.Start()
}

// Start starts the server again after Stop, on the same port, empty.
func (r *RedisServer) Start() error {
	attr, err := childAttr(false, syscall.SIGKILL)
	if err != nil {
		return err
	}
	r.out = &Buffer{}
	cmd := exec.Command(r.bin, "--port", strconv.Itoa(r.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no")
	cmd.Stdout, cmd.Stderr, cmd.SysProcAttr = r.out, r.out, attr
	if r.proc, err = startChild(cmd); err != nil {
		return fmt.Errorf("start redis-server: %w", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", r.Addr, 200*time.Millisecond)
		if err == nil {
			c.Close()
			return nil
		}
		select {
		case <-r.proc.done:
			return fmt.Errorf("redis-server exited on start:\n%s", r.out.String())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			r.Stop()
			return fmt.Errorf("redis-server not ready after 10s:\n%s", r.out.String())
		}
	}
}

// Stop kills the server (SIGKILL: what it has is lost, as in a crash).
func (r *RedisServer) Stop() {
	if r.proc != nil {
		r.proc.stop(syscall.SIGKILL, 0)
		r.proc = nil
	}
}
