//go:build !linux

package stack

func portHolder(int) string { return "" }
