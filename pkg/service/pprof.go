package service

import (
	"fmt"
	"log/slog"
	"net/http"
	"net/http/pprof"
	"time"
)

// PprofTask serves Go's runtime profiles (net/http/pprof, under
// /debug/pprof/) on addr, for PPROF_ADDR. They show the process's stacks,
// command line and memory, so addr must be a loopback address: a profile is
// taken from the machine (or through an SSH tunnel), never from the
// network. The profiles are on their own listener, not on the service's
// router, so no route of the API exposes them.
func PprofTask(addr string, log *slog.Logger) (Task, error) {
	if !Loopback(addr) {
		return Task{}, fmt.Errorf("PPROF_ADDR %q: profiles expose the process's memory; want a loopback address such as 127.0.0.1:6060", addr)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	// A CPU profile or trace streams for as long as it was asked (seconds=N).
	t := HTTPTask(addr, mux, log, HTTPTimeouts{Write: 5 * time.Minute})
	t.Name = "pprof " + addr
	return t, nil
}
