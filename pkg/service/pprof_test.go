package service_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/effectively-once/payments-cashback/internal/ports"
	"github.com/effectively-once/payments-cashback/pkg/service"
)

var quiet = slog.New(slog.DiscardHandler)

func TestPprofTaskRefusesAnAddressOffThisMachine(t *testing.T) {
	for _, addr := range []string{"0.0.0.0:6060", ":6060", "10.1.2.3:6060", "example.com:6060", "6060"} {
		if _, err := service.PprofTask(addr, quiet); err == nil || !strings.Contains(err.Error(), "loopback") {
			t.Errorf("PprofTask(%q) = %v, want a refusal naming loopback", addr, err)
		}
	}
}

func TestPprofTaskServesProfilesOnLoopbackUntilCancelled(t *testing.T) {
	// Outside the ephemeral range: no connection of another test takes it meanwhile.
	port, err := ports.Free()
	if err != nil {
		t.Fatal(err)
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	task, err := service.PprofTask(addr, quiet)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- task.Run(ctx) }()
	var body string
	deadline := time.Now().Add(5 * time.Second)
	for {
		resp, err := http.Get("http://" + addr + "/debug/pprof/goroutine?debug=1")
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d: %s", resp.StatusCode, b)
			}
			body = string(b)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pprof never answered on %s: %v", addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// A goroutine profile of this process: it names this very test.
	if !strings.Contains(body, "TestPprofTaskServesProfilesOnLoopbackUntilCancelled") {
		t.Fatalf("the goroutine profile does not show this test's goroutine:\n%.500s", body)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run after cancel = %v, want nil", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the pprof server did not stop on cancel")
	}
	if _, err := http.Get("http://" + addr + "/debug/pprof/"); err == nil {
		t.Fatal("pprof still answers after its task returned")
	}
}
