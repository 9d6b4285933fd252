package failpoint

import (
	"testing"
)

func TestInertUnlessArmed(t *testing.T) {
	if Hit("nothing-armed") {
		t.Fatal("an unarmed failpoint fired")
	}
	off := Enable("step", 2)
	if Hit("step") {
		t.Fatal("fired on hit 1, armed from 2")
	}
	if !Hit("step") || !Hit("step") {
		t.Fatal("did not fire from hit 2 on")
	}
	off()
	if Hit("step") {
		t.Fatal("fired after disable")
	}
}
