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

func TestAimedAtASubject(t *testing.T) {
	off := EnableFor("aimed", "u_1", 2)
	defer off()
	if Hit("aimed") || HitFor("aimed", "u_2") || HitFor("aimed", "u_2") {
		t.Fatal("fired for another subject")
	}
	if HitFor("aimed", "u_1") {
		t.Fatal("fired on its subject's hit 1, armed from 2: other subjects' hits were counted")
	}
	if !HitFor("aimed", "u_1") {
		t.Fatal("did not fire on its subject's hit 2")
	}
	off()
	on := Enable("any", 1)
	defer on()
	if !HitFor("any", "u_9") {
		t.Fatal("a point armed for any subject did not fire on HitFor")
	}
}
