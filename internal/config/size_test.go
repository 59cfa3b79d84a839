package config

import "testing"

func TestParseSize(t *testing.T) {
	tests := []struct {
		in   string
		want int64
		bad  bool
	}{
		{"512MiB", 512 << 20, false},
		{"100MiB", 100 << 20, false},
		{"1GiB", 1 << 30, false},
		{"1.5GiB", 3 << 29, false},
		{"64k", 64000, false},
		{"2 MB", 2_000_000, false},
		{"4096", 4096, false},
		{"", 0, true},
		{"MiB", 0, true},
		{"-1MiB", 0, true},
		{"12 parsecs", 0, true},
		{"99999999TiB", 0, true},
	}
	for _, tt := range tests {
		got, err := ParseSize(tt.in)
		if (err != nil) != tt.bad || got != tt.want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d, bad=%v", tt.in, got, err, tt.want, tt.bad)
		}
	}
}
