package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"runtime/debug"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"
	"unicode/utf8"
)

// Row is one line of the table.
type Row struct {
	Key     string  `json:"key"`
	Section string  `json:"section"`
	Name    string  `json:"measurement"`
	Value   float64 `json:"value"`
	Unit    string  `json:"unit"`
	// Baseline is what Value is compared with, when anything is.
	Baseline *Ref `json:"baseline,omitempty"`
	// Ratio is Value / Baseline.Value, or, when both rows have the same
	// number of interleaved rounds, the median of the per-round ratios
	// (round i of the row over round i of its baseline): a burst of load
	// that slowed one round slowed both sides of that round's ratio.
	Ratio float64 `json:"ratio,omitempty"`
	// Rounds are the row's per-round values (rates, drain rates), in the
	// order they ran; RatioRounds the per-round ratios, Spread the
	// quartiles and extremes of RatioRounds (or of Rounds when there is no
	// baseline).
	Rounds      []float64 `json:"rounds,omitempty"`
	RatioRounds []float64 `json:"ratio_rounds,omitempty"`
	Spread      *Spread   `json:"spread,omitempty"`
	Target      *Target   `json:"target,omitempty"`
	Met         *bool     `json:"met,omitempty"`
	// Details: sample counts, percentiles, elapsed time, ...
	Details map[string]any `json:"details,omitempty"`
}

// Ref names a baseline row and carries its value.
type Ref struct {
	Key    string    `json:"key"`
	Name   string    `json:"measurement"`
	Value  float64   `json:"value"`
	Unit   string    `json:"unit"`
	Rounds []float64 `json:"-"`
}

// Spread is where the rounds lie: extremes and quartiles.
type Spread struct {
	Min float64 `json:"min"`
	Q1  float64 `json:"q1"`
	Q3  float64 `json:"q3"`
	Max float64 `json:"max"`
	N   int     `json:"rounds"`
}

func spreadOf(vs []float64) *Spread {
	if len(vs) < 2 {
		return nil
	}
	s := slices.Clone(vs)
	slices.Sort(s)
	return &Spread{Min: s[0], Q1: quartile(s, 0.25), Q3: quartile(s, 0.75), Max: s[len(s)-1], N: len(s)}
}

// quartile of sorted values, interpolating between ranks (the method of
// most statistics packages), so that 5 rounds give a Q1 between the 2nd
// and the 3rd value rather than the 2nd itself.
func quartile(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return math.NaN()
	}
	pos := q * float64(len(sorted)-1)
	lo := int(math.Floor(pos))
	hi := min(lo+1, len(sorted)-1)
	return sorted[lo] + (pos-float64(lo))*(sorted[hi]-sorted[lo])
}

// Target is what a row is held to: the ratio at least Min, or the value at
// most Max (absolute value when Abs).
type Target struct {
	Text     string   `json:"text"`
	MinRatio *float64 `json:"min_ratio,omitempty"`
	MinValue *float64 `json:"min_value,omitempty"`
	MaxValue *float64 `json:"max_value,omitempty"`
	Abs      bool     `json:"abs,omitempty"`
}

func minRatio(r float64) *Target {
	return &Target{Text: fmt.Sprintf("≥ %s×", trimFloat(r)), MinRatio: &r}
}

func minValue(v float64, unit string) *Target {
	return &Target{Text: fmt.Sprintf("≥ %s %s", trimFloat(v), unit), MinValue: &v}
}

func maxValue(v float64, unit string) *Target {
	return &Target{Text: fmt.Sprintf("≤ %s %s", trimFloat(v), unit), MaxValue: &v}
}

func maxAbs(v float64, unit string) *Target {
	return &Target{Text: fmt.Sprintf("±%s%s", trimFloat(v), unit), MaxValue: &v, Abs: true}
}

func trimFloat(f float64) string {
	s := fmt.Sprintf("%.2f", f)
	s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	return s
}

type report struct {
	RunID   string         `json:"run_id"`
	Started time.Time      `json:"started"`
	Elapsed string         `json:"elapsed"`
	Machine machine        `json:"machine"`
	Options map[string]any `json:"options"`
	Rows    []*Row         `json:"results"`
	Soak    *soakResult    `json:"soak,omitempty"`
	Notes   []string       `json:"notes,omitempty"`

	mu sync.Mutex
}

func jsonOptions(o options) map[string]any {
	return map[string]any{
		"duration": o.duration.String(), "conns": o.conns, "payments": o.payments,
		"soak": o.soak.String(), "skip_pipeline": o.skipPipeline, "relay_rows": o.relayRows, "rounds": o.rounds, "sqs_rounds": o.sqsRounds, "base_port": o.basePort,
	}
}

// add records a row, working out its ratio and whether it met its target.
func (r *report) add(row *Row) *Row {
	r.mu.Lock()
	defer r.mu.Unlock()
	if row.Baseline != nil && row.Baseline.Value != 0 {
		row.Ratio = row.Value / row.Baseline.Value
		if b := row.Baseline.Rounds; len(b) <= 1 || len(b) != len(row.Rounds) {
			// Said, not silent: such a ratio is not of interleaved rounds,
			// and a target is judged on it, not on a lower quartile.
			r.Notes = append(r.Notes, fmt.Sprintf("%s: a ratio of one value to another (%d rounds against the baseline's %d), not the median of per-round ratios; its target is judged on that one value",
				row.Key, len(row.Rounds), len(b)))
		} else {
			row.RatioRounds = make([]float64, len(b))
			for i := range b {
				row.RatioRounds[i] = row.Rounds[i] / b[i]
			}
			sorted := slices.Clone(row.RatioRounds)
			slices.Sort(sorted)
			row.Ratio = median(sorted)
		}
	}
	if row.RatioRounds != nil {
		row.Spread = spreadOf(row.RatioRounds)
	} else if row.Baseline == nil {
		row.Spread = spreadOf(row.Rounds)
	}
	if t := row.Target; t != nil {
		var met bool
		switch {
		case t.MinRatio != nil:
			// Met only when the lower quartile of the rounds meets it: a
			// median just over the line on a noisy machine is not a pass.
			low := row.Ratio
			if row.Spread != nil && row.RatioRounds != nil {
				low = row.Spread.Q1
			}
			met = row.Baseline != nil && low >= *t.MinRatio
		case t.MinValue != nil:
			low := row.Value
			if row.Spread != nil {
				low = row.Spread.Q1
			}
			met = low >= *t.MinValue
		case t.MaxValue != nil && t.Abs:
			met = math.Abs(row.Value) <= *t.MaxValue
		case t.MaxValue != nil:
			met = row.Value <= *t.MaxValue
		}
		row.Met = &met
	}
	r.Rows = append(r.Rows, row)
	met := ""
	if row.Met != nil {
		met = map[bool]string{true: " (met)", false: " (NOT met)"}[*row.Met]
	}
	ratio := ""
	if row.Baseline != nil {
		ratio = fmt.Sprintf(" = %.2f× %s", row.Ratio, row.Baseline.Name)
	}
	if sp := row.Spread; sp != nil {
		ratio += " [" + sp.text() + "]"
	}
	progress("  %-52s %s %s%s%s", row.Name, fmtValue(row.Value), row.Unit, ratio, met)
	return row
}

func (r *report) note(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.Notes = append(r.Notes, fmt.Sprintf(format, args...))
}

// ref returns a reference to the row with key, or nil.
func (r *report) ref(key string) *Ref {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, row := range r.Rows {
		if row.Key == key {
			return &Ref{Key: key, Name: row.Name, Value: row.Value, Unit: row.Unit, Rounds: row.Rounds}
		}
	}
	return nil
}

func fmtValue(v float64) string {
	switch a := math.Abs(v); {
	case a == 0:
		return "0"
	case a >= 100:
		return fmt.Sprintf("%.0f", v)
	case a >= 10:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.2f", v)
	}
}

// text is the spread as the table prints it: quartiles, then extremes.
func (sp *Spread) text() string {
	return fmt.Sprintf("q1–q3 %s–%s, min–max %s–%s, %d rounds", fmtSpread(sp.Q1), fmtSpread(sp.Q3), fmtSpread(sp.Min), fmtSpread(sp.Max), sp.N)
}

func fmtSpread(v float64) string {
	if math.Abs(v) < 10 {
		return fmt.Sprintf("%.2f", v)
	}
	return fmtValue(v)
}

// print writes the table, aligned, as a markdown table.
func (r *report) print(w io.Writer) {
	header := []string{"measurement", "value", "unit", "baseline", "ratio", "spread (q1–q3, min–max)", "target", "met"}
	rows := [][]string{}
	section := ""
	for _, row := range r.Rows {
		if row.Section != section {
			section = row.Section
			rows = append(rows, []string{"**" + section + "**", "", "", "", "", "", "", ""})
		}
		base, ratio, spread, target, met := "", "", "", "", ""
		if sp := row.Spread; sp != nil {
			spread = fmt.Sprintf("%s–%s, %s–%s", fmtSpread(sp.Q1), fmtSpread(sp.Q3), fmtSpread(sp.Min), fmtSpread(sp.Max))
		}
		if row.Baseline != nil {
			base = fmtValue(row.Baseline.Value) + " (" + row.Baseline.Key + ")"
			ratio = fmt.Sprintf("%.2f×", row.Ratio)
		}
		if row.Target != nil {
			target = row.Target.Text
		}
		if row.Met != nil {
			met = map[bool]string{true: "yes", false: "**no**"}[*row.Met]
		}
		rows = append(rows, []string{row.Name + " `" + row.Key + "`", fmtValue(row.Value), row.Unit, base, ratio, spread, target, met})
	}
	width := make([]int, len(header))
	for i, h := range header {
		width[i] = utf8.RuneCountInString(h)
	}
	for _, cells := range rows {
		for i, c := range cells {
			width[i] = max(width[i], utf8.RuneCountInString(c))
		}
	}
	right := map[int]bool{1: true, 4: true}
	line := func(cells []string) {
		var b strings.Builder
		b.WriteString("|")
		for i, c := range cells {
			pad := strings.Repeat(" ", width[i]-utf8.RuneCountInString(c))
			if right[i] {
				b.WriteString(" " + pad + c + " |")
			} else {
				b.WriteString(" " + c + pad + " |")
			}
		}
		fmt.Fprintln(w, b.String())
	}
	fmt.Fprintf(w, "\nbench run %s, %s: %d CPUs (%s), %s, %s, %s\n\n", r.RunID, r.Started.Format(time.RFC3339),
		r.Machine.NumCPU, r.Machine.CPUModel, r.Machine.MemTotal, r.Machine.GoVersion, r.Machine.PostgresShort)
	line(header)
	sep := make([]string, len(header))
	for i := range sep {
		sep[i] = strings.Repeat("-", width[i])
		if right[i] {
			sep[i] = sep[i][:len(sep[i])-1] + ":"
		}
	}
	line(sep)
	for _, cells := range rows {
		line(cells)
	}
	r.printCPU(w)
	if r.Soak != nil {
		fmt.Fprintf(w, "\nsoak: %s at full load, RSS sampled every %s (first = after %s warm-up):\n\n", r.Soak.Duration, r.Soak.Interval, r.Soak.Warmup)
		fmt.Fprintf(w, "| service | pid | first MiB | last MiB | max MiB | drift |\n|---|---:|---:|---:|---:|---:|\n")
		for _, s := range r.Soak.Services {
			fmt.Fprintf(w, "| %s | %d | %.1f | %.1f | %.1f | %+.1f%% |\n", s.Name, s.Pid, s.FirstMiB, s.LastMiB, s.MaxMiB, s.DriftPct)
		}
	}
	if len(r.Notes) > 0 {
		fmt.Fprintln(w)
		for _, n := range r.Notes {
			fmt.Fprintln(w, "- "+n)
		}
	}
	var met, missed []string
	for _, row := range r.Rows {
		if row.Met == nil {
			continue
		}
		s := fmt.Sprintf("%s: %s %s", row.Key, fmtRatioOrValue(row), row.Target.Text)
		if *row.Met {
			met = append(met, s)
		} else {
			missed = append(missed, s)
		}
	}
	fmt.Fprintf(w, "\ntargets met: %d of %d\n", len(met), len(met)+len(missed))
	for _, s := range missed {
		fmt.Fprintln(w, "  missed: "+s)
	}
}

// printCPU writes where the cores went during the measurements that
// recorded it: on a small machine that is what limits most figures.
func (r *report) printCPU(w io.Writer) {
	cols := []string{"machine", "postgres", "sqs", "bench", "payments", "rewards", "notifications", "smsprovider", "other"}
	used := map[string]bool{}
	var rows []*Row
	for _, row := range r.Rows {
		u, ok := row.Details["cpu_cores"].(map[string]float64)
		if !ok || len(u) == 0 {
			continue
		}
		rows = append(rows, row)
		for k := range u {
			used[k] = true
		}
	}
	if len(rows) == 0 {
		return
	}
	var shown []string
	for _, c := range cols {
		if used[c] {
			shown = append(shown, c)
		}
	}
	fmt.Fprintf(w, "\ncores busy during each measurement (of %d; sqs = the SQS server process, other = the rest of the machine):\n\n", r.Machine.NumCPU)
	fmt.Fprintf(w, "| measurement | %s |\n|---|%s\n", strings.Join(shown, " | "), strings.Repeat("---:|", len(shown)))
	for _, row := range rows {
		u := row.Details["cpu_cores"].(map[string]float64)
		cells := make([]string, len(shown))
		for i, c := range shown {
			cells[i] = fmt.Sprintf("%.2f", u[c])
		}
		fmt.Fprintf(w, "| %s | %s |\n", row.Key, strings.Join(cells, " | "))
	}
}

func fmtRatioOrValue(row *Row) string {
	if row.Target.MinRatio != nil {
		if row.Spread != nil && row.RatioRounds != nil {
			return fmt.Sprintf("%.2f× (q1 %.2f×)", row.Ratio, row.Spread.Q1)
		}
		return fmt.Sprintf("%.2f×", row.Ratio)
	}
	return fmtValue(row.Value) + " " + row.Unit
}

func (r *report) write(path string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// machine describes where the run happened.
type machine struct {
	NumCPU        int               `json:"nproc"`
	CPUModel      string            `json:"cpu_model"`
	MemTotal      string            `json:"mem_total"`
	Kernel        string            `json:"kernel"`
	GoVersion     string            `json:"go_version"`
	Postgres      string            `json:"postgres_version"`
	PostgresShort string            `json:"-"`
	PGSettings    map[string]string `json:"postgres_settings"`
	Modules       map[string]string `json:"modules,omitempty"`
}

func machineInfo(ctx context.Context, pg *pgEnv) machine {
	m := machine{NumCPU: runtime.NumCPU(), GoVersion: runtime.Version(), CPUModel: "unknown", PGSettings: map[string]string{}}
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		s := bufio.NewScanner(f)
		for s.Scan() {
			if k, v, ok := strings.Cut(s.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPUModel = strings.TrimSpace(v)
				break
			}
		}
		f.Close()
	}
	if f, err := os.Open("/proc/meminfo"); err == nil {
		s := bufio.NewScanner(f)
		for s.Scan() {
			var kb int64
			if _, err := fmt.Sscanf(s.Text(), "MemTotal: %d kB", &kb); err == nil {
				m.MemTotal = fmt.Sprintf("%.0f GiB RAM", float64(kb)/(1<<20))
				break
			}
		}
		f.Close()
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = "Linux " + strings.TrimSpace(string(b))
	}
	_ = pg.admin.QueryRow(ctx, `SELECT version()`).Scan(&m.Postgres)
	m.PostgresShort = m.Postgres
	if f := strings.Fields(m.Postgres); len(f) >= 2 {
		m.PostgresShort = f[0] + " " + f[1]
	}
	for _, name := range []string{"fsync", "synchronous_commit", "wal_sync_method", "shared_buffers", "max_connections"} {
		var v string
		if err := pg.admin.QueryRow(ctx, "SELECT current_setting($1)", name).Scan(&v); err == nil {
			m.PGSettings[name] = v
		}
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		m.Modules = map[string]string{}
		for _, d := range bi.Deps {
			switch d.Path {
			case "github.com/jackc/pgx/v5", "github.com/aws/aws-sdk-go-v2/service/sqs":
				m.Modules[d.Path] = d.Version
			}
		}
	}
	return m
}

// percentile of sorted values (nearest rank).
func percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return math.NaN()
	}
	i := int(math.Ceil(p*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// median of sorted values.
func median(sorted []float64) float64 {
	n := len(sorted)
	switch {
	case n == 0:
		return math.NaN()
	case n%2 == 1:
		return sorted[n/2]
	default:
		return (sorted[n/2-1] + sorted[n/2]) / 2
	}
}

func sortedMillis(ds []time.Duration) []float64 {
	out := make([]float64, len(ds))
	for i, d := range ds {
		out[i] = float64(d) / float64(time.Millisecond)
	}
	sort.Float64s(out)
	return out
}

func medianOf(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return median(s)
}
