package cron

import (
	"testing"
	"time"
)

// The recurring firer calls Next once per fire; these give its cost for a
// busy schedule and for one that searches far (the bench of the store wiring
// measures the end-to-end figures).
func BenchmarkNext(b *testing.B) {
	berlin, _ := LoadLocation("Europe/Berlin")
	for _, c := range []struct{ name, expr string }{
		{"every-second", "* * * * * ?"},
		{"daily-02:30", "0 30 2 * * ?"},
		{"fifth-monday", "0 0 12 ? * 2#5"},
		{"29-february", "0 0 0 29 2 ?"},
	} {
		s, err := Parse(c.expr)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(c.name, func(b *testing.B) {
			after := time.Date(2026, 10, 24, 23, 0, 0, 0, time.UTC)
			for i := 0; i < b.N; i++ {
				_ = s.Next(after, berlin)
			}
		})
	}
}
