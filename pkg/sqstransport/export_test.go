package sqstransport

import "time"

// SetSenderIdle sets how long p's senders wait for work; call it before p
// publishes.
func SetSenderIdle(p *Publisher, d time.Duration) { p.idle = d }
