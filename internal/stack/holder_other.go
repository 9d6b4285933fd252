//go:build !linux

package stack

func portHolder(int) string { return "" }

// ListenerPID is not implemented off Linux: it always returns 0.
func ListenerPID(int) int { return 0 }
