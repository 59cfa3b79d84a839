package metrics

import "testing"

func TestBucketQuantile(t *testing.T) {
	t.Parallel()
	bounds := []float64{1, 2, 4}
	for _, c := range []struct {
		p    float64
		cum  []uint64
		want float64
	}{
		{0.5, []uint64{0, 10, 10}, 1.5},  // all in (1, 2]: the median halfway
		{0.5, []uint64{10, 10, 10}, 0.5}, // all in (0, 1]
		{0.99, []uint64{0, 0, 10}, 3.98}, // all in (2, 4]
		{0.5, []uint64{0, 0, 0}, 4},      // past the last bound (count 10, none in buckets)
	} {
		if got := bucketQuantile(c.p, 10, bounds, c.cum); got < c.want-1e-9 || got > c.want+1e-9 {
			t.Errorf("bucketQuantile(%v, %v) = %v, want %v", c.p, c.cum, got, c.want)
		}
	}
}
