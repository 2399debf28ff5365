package config

import (
	"strings"
	"testing"
)

// DELAYBRIDGE_NSB_NATIVE_DELAYS is off by default, a boolean, and with it on
// the error queue cannot be one of the level queues it consumes (each error
// copy would come straight back).
func TestNSBNativeDelays(t *testing.T) {
	if c, err := loadClean(t, nil); err != nil || c.NSBNativeDelays {
		t.Fatalf("default: %v, %v", c.NSBNativeDelays, err)
	}
	if c, err := loadClean(t, map[string]string{"DELAYBRIDGE_NSB_NATIVE_DELAYS": "true"}); err != nil || !c.NSBNativeDelays {
		t.Fatalf("true: %v, %v", c.NSBNativeDelays, err)
	}
	if _, err := loadClean(t, map[string]string{"DELAYBRIDGE_NSB_NATIVE_DELAYS": "maybe"}); err == nil || !strings.Contains(err.Error(), "DELAYBRIDGE_NSB_NATIVE_DELAYS") {
		t.Errorf("maybe: %v", err)
	}
	for _, q := range []string{"nsb.v2.delay-level-05", "nsb.delay-level-27"} {
		_, err := loadClean(t, map[string]string{"DELAYBRIDGE_NSB_NATIVE_DELAYS": "true", "DELAYBRIDGE_ERROR_QUEUE": q})
		if err == nil || !strings.Contains(err.Error(), "DELAYBRIDGE_ERROR_QUEUE") || !strings.Contains(err.Error(), "delay-level queue") {
			t.Errorf("error queue %s: %v", q, err)
		}
		if _, err := loadClean(t, map[string]string{"DELAYBRIDGE_ERROR_QUEUE": q}); err != nil {
			t.Errorf("error queue %s without native delays: %v", q, err)
		}
	}
}
