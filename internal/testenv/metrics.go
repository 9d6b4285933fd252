package testenv

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// Metrics is an OpenTelemetry meter provider with a manual reader: give
// Provider to the code under test, then read what it recorded with Value.
type Metrics struct {
	Reader   *sdkmetric.ManualReader
	Provider *sdkmetric.MeterProvider
}

// NewMetrics returns an empty Metrics.
func NewMetrics() *Metrics {
	r := sdkmetric.NewManualReader()
	return &Metrics{Reader: r, Provider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(r))}
}

// Value sums the data points of the named counter or gauge whose
// attributes include every key, value pair in attrs.
func (m *Metrics) Value(t testing.TB, name string, attrs ...string) float64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := m.Reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	match := func(set attribute.Set) bool {
		for i := 0; i+1 < len(attrs); i += 2 {
			if v, ok := set.Value(attribute.Key(attrs[i])); !ok || v.Emit() != attrs[i+1] {
				return false
			}
		}
		return true
	}
	var sum float64
	add := func(set attribute.Set, v float64) {
		if match(set) {
			sum += v
		}
	}
	for _, sm := range rm.ScopeMetrics {
		for _, mt := range sm.Metrics {
			if mt.Name != name {
				continue
			}
			switch d := mt.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					add(p.Attributes, float64(p.Value))
				}
			case metricdata.Gauge[int64]:
				for _, p := range d.DataPoints {
					add(p.Attributes, float64(p.Value))
				}
			case metricdata.Gauge[float64]:
				for _, p := range d.DataPoints {
					add(p.Attributes, p.Value)
				}
			}
		}
	}
	return sum
}
