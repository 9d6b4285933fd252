package main

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/effectively-once/payments-cashback/internal/stack"
)

// CPU accounting from /proc (Linux; elsewhere every figure reads 0): who
// used the machine's cores during a measurement. On a 2-core machine that
// is usually what limits a figure: the bench, PostgreSQL and the SQS server
// share the same cores, and anything else running shows up as "other".

const clockTicks = 100 // USER_HZ, 100 on every Linux the bench runs on

// cpuGroups names the processes whose CPU is accounted separately.
type cpuGroups struct {
	postmaster int            // PostgreSQL server: it and its children
	sqs        int            // the SQS server process (fauxqs)
	extra      map[string]int // more processes by name (the services)
}

// cpu is the run's accounting, set up by run.
var cpu *cpuGroups

// cpuOf runs f and returns the cores each group used meanwhile.
func cpuOf(f func() error) (cpuUse, error) {
	s0 := cpu.sample()
	err := f()
	return s0.until(cpu.sample()), err
}

type cpuSample struct {
	at    time.Time
	ticks map[string]float64 // by group, plus "machine" (all busy CPU)
}

// findCPUGroups finds the PostgreSQL server of pg (the parent of our
// backend) and the process listening on the SQS endpoint's port.
func findCPUGroups(ctx context.Context, pg *pgEnv) *cpuGroups {
	g := &cpuGroups{extra: map[string]int{}}
	var backend int
	if err := pg.admin.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&backend); err == nil {
		if st, err := readStat(backend); err == nil {
			g.postmaster = st.ppid
		}
	}
	ep := os.Getenv("AWS_ENDPOINT_URL_SQS")
	if ep == "" {
		ep = os.Getenv("AWS_ENDPOINT_URL")
	}
	if u, err := url.Parse(ep); err == nil {
		if p, err := strconv.Atoi(u.Port()); err == nil {
			g.sqs = stack.ListenerPID(p)
		}
	}
	return g
}

type procStat struct {
	ppid                       int
	utime, stime, cutime, cstm float64
}

func readStat(pid int) (procStat, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procStat{}, err
	}
	// pid (comm) state ppid ... ; comm may hold spaces and parentheses.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return procStat{}, fmt.Errorf("bad /proc/%d/stat", pid)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 15 {
		return procStat{}, fmt.Errorf("short /proc/%d/stat", pid)
	}
	num := func(k int) float64 { v, _ := strconv.ParseFloat(f[k], 64); return v }
	ppid, _ := strconv.Atoi(f[1])
	// f[0] is field 3 (state): utime is field 14, so f[11].
	return procStat{ppid: ppid, utime: num(11), stime: num(12), cutime: num(13), cstm: num(14)}, nil
}

func (g *cpuGroups) sample() cpuSample {
	s := cpuSample{at: time.Now(), ticks: map[string]float64{}}
	if g == nil {
		return s
	}
	if b, err := os.ReadFile("/proc/stat"); err == nil {
		line, _, _ := strings.Cut(string(b), "\n")
		f := strings.Fields(line)
		var busy float64
		for k, v := range f[1:] {
			x, _ := strconv.ParseFloat(v, 64)
			if k == 3 || k == 4 || k >= 8 { // idle, iowait; guest time is already in user
				continue
			}
			busy += x
		}
		s.ticks["machine"] = busy
	}
	if st, err := readStat(os.Getpid()); err == nil {
		s.ticks["bench"] = st.utime + st.stime
	}
	if g.sqs > 0 {
		if st, err := readStat(g.sqs); err == nil {
			s.ticks["sqs"] = st.utime + st.stime
		}
	}
	for name, pid := range g.extra {
		if st, err := readStat(pid); err == nil {
			s.ticks[name] = st.utime + st.stime
		}
	}
	if g.postmaster > 0 {
		// The server and its backends; backends that exited meanwhile were
		// reaped by the postmaster, so their time is in its cutime.
		if st, err := readStat(g.postmaster); err == nil {
			total := st.utime + st.stime + st.cutime + st.cstm
			dirs, _ := filepath.Glob("/proc/[0-9]*")
			for _, d := range dirs {
				pid, err := strconv.Atoi(filepath.Base(d))
				if err != nil {
					continue
				}
				if c, err := readStat(pid); err == nil && c.ppid == g.postmaster {
					total += c.utime + c.stime
				}
			}
			s.ticks["postgres"] = total
		}
	}
	return s
}

// cpuUse is cores used per group between two samples.
type cpuUse map[string]float64

func (a cpuSample) until(b cpuSample) cpuUse {
	el := b.at.Sub(a.at).Seconds()
	u := cpuUse{}
	if el <= 0 {
		return u
	}
	known := 0.0
	for k, v := range b.ticks {
		d := (v - a.ticks[k]) / clockTicks / el
		if d < 0 {
			d = 0
		}
		u[k] = d
		if k != "machine" {
			known += d
		}
	}
	if m, ok := u["machine"]; ok {
		u["other"] = max(0, m-known)
	}
	return u
}

// add accumulates another use, weighted by its duration, into u (weighted
// by done); for interleaved segments.
func (u cpuUse) add(v cpuUse, done, more time.Duration) cpuUse {
	if u == nil {
		u = cpuUse{}
	}
	w0, w1 := done.Seconds(), more.Seconds()
	if w0+w1 == 0 {
		return u
	}
	keys := map[string]bool{}
	for k := range u {
		keys[k] = true
	}
	for k := range v {
		keys[k] = true
	}
	for k := range keys {
		u[k] = (u[k]*w0 + v[k]*w1) / (w0 + w1)
	}
	return u
}

// rounded is u with two decimals, for JSON.
func (u cpuUse) rounded() map[string]float64 {
	out := make(map[string]float64, len(u))
	for k, v := range u {
		out[k] = float64(int(v*100+0.5)) / 100
	}
	return out
}
