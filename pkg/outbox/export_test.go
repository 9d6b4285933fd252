package outbox

// SetGaugeCap bounds the backlog the gauges count, for tests; it returns a
// function that restores the previous bound.
func SetGaugeCap(n int64) (restore func()) {
	old := gaugeCap
	gaugeCap = n
	return func() { gaugeCap = old }
}
