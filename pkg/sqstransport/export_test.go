package sqstransport

import "time"

// SetSenderIdle sets how long p's senders wait for work; call it before p
// publishes.
func SetSenderIdle(p *Publisher, d time.Duration) { p.idle = d }

// SetCallTimeout sets the deadline of s's calls to SQS (a receive's is
// WaitTime more); call it before s runs.
func SetCallTimeout(s *Subscriber, d time.Duration) { s.callTimeout = d }
