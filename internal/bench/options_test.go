package bench

import "testing"

func TestOptionsRuns(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		only, name string
		want       bool
	}{
		{"", "density", true},
		{"warm", "warm 1+1", true},
		{"warm", "baselines", false},
		{"baselines,pool", "baselines", true},
		{"baselines,pool", "create → first print(1), pool miss", true},
		{"baselines, pool", "create → first print(1), pool hit", true},
		{"baselines,pool", "warm 1+1", false},
		{",", "warm 1+1", false},
	} {
		if got := (Options{Only: c.only}).runs(c.name); got != c.want {
			t.Errorf("--only %q runs %q = %v, want %v", c.only, c.name, got, c.want)
		}
	}
}
