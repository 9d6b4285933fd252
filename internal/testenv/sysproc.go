package testenv

import "github.com/effectively-once/payments-cashback/internal/sysproc"

// Process plumbing shared with internal/stack (see package sysproc):
// parent-death signal, running as the postgres user, liveness by pid.
var (
	childAttr     = sysproc.ChildAttr
	chownForChild = sysproc.ChownForChild
	processAlive  = sysproc.Alive
)
