package main

import (
	"testing"
	"time"
)

func TestQuantile(t *testing.T) {
	var lat []time.Duration
	for i := 1; i <= 1000; i++ {
		lat = append(lat, time.Duration(i)*time.Microsecond)
	}
	for _, tt := range []struct {
		p    float64
		want time.Duration
	}{{0.5, 500 * time.Microsecond}, {0.9, 900 * time.Microsecond}, {0.99, 990 * time.Microsecond}, {1, 1000 * time.Microsecond}, {0.0001, time.Microsecond}} {
		if got := quantile(lat, tt.p); got != tt.want {
			t.Errorf("quantile(1..1000µs, %v): got %v, want %v", tt.p, got, tt.want)
		}
	}
	if got := quantile([]time.Duration{7}, 0.99); got != 7 {
		t.Errorf("one value: got %v, want 7", got)
	}
}
