package service_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/effectively-once/payments-cashback/pkg/service"
)

// Whatever Host header a caller sends, the HTTP metrics keep one
// server.address and no client-chosen server.port: a scan with 50 made-up
// hosts must not make 50 new series on every service's /metrics.
func TestACallersHostHeaderMakesNoNewMetricSeries(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	prev := otel.GetMeterProvider()
	otel.SetMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)))
	t.Cleanup(func() { otel.SetMeterProvider(prev) })

	r := service.NewRouter(slog.New(slog.DiscardHandler), nil, nil)
	r.Get("/v1/things", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) })
	for i := range 50 {
		req := httptest.NewRequest(http.MethodGet, "/v1/things", nil)
		req.Host = fmt.Sprintf("scan-%d.attacker.example:%d", i, 1000+i)
		r.ServeHTTP(httptest.NewRecorder(), req)
	}
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	values := map[attribute.Key]map[string]bool{"server.address": {}, "server.port": {}}
	points := 0
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			var sets []attribute.Set
			switch d := m.Data.(type) {
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					sets = append(sets, p.Attributes)
				}
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					sets = append(sets, p.Attributes)
				}
			case metricdata.Histogram[int64]:
				for _, p := range d.DataPoints {
					sets = append(sets, p.Attributes)
				}
			}
			for _, s := range sets {
				points++
				for k := range values {
					if v, ok := s.Value(k); ok {
						values[k][v.Emit()] = true
					}
				}
			}
		}
	}
	if points == 0 {
		t.Fatal("no HTTP metric was recorded: the test measures nothing")
	}
	if n := len(values["server.address"]); n > 1 {
		t.Errorf("50 Host headers made %d server.address values, want at most 1", n)
	}
	if n := len(values["server.port"]); n > 0 {
		t.Errorf("50 Host headers made %d server.port values, want none (the caller's port is not the server's)", n)
	}
}
