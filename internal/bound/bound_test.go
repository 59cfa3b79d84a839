package bound

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/apierr"
)

// refused fails unless err is a 400 naming field first.
func refused(t *testing.T, err error, field string) {
	t.Helper()
	e := apierr.From(err)
	if err == nil || e.Code != apierr.BadRequest || !strings.HasPrefix(e.Message, field+" ") || e.Details["field"] != field {
		t.Fatalf("want ERR_BAD_REQUEST naming %q, got %v", field, err)
	}
}

func TestSecondsBounds(t *testing.T) {
	t.Parallel()
	for _, v := range []float64{0, -1, math.NaN(), math.Inf(1), math.Inf(-1), 18446744074, math.MaxInt64, 86401} {
		if _, err := Seconds("timeout", v, 24*time.Hour); err == nil {
			t.Errorf("Seconds(%v) accepted", v)
		} else {
			refused(t, err, "timeout")
		}
	}
	// A limit above MaxDuration is cut to it: nothing accepted overflows.
	if _, err := Seconds("timeout", 18446744074, math.MaxInt64); err == nil {
		t.Fatal("18446744074 s accepted under an unbounded limit")
	}
	d, err := Seconds("timeout", 1.5, time.Minute)
	if err != nil || d != 1500*time.Millisecond {
		t.Fatalf("Seconds(1.5) = %v, %v", d, err)
	}
}

func TestWholeSecondsAndMillis(t *testing.T) {
	t.Parallel()
	for _, v := range []int64{0, -1, math.MaxInt64, math.MinInt64, 18446744074 / 2} {
		if _, err := WholeSeconds("timeout_seconds", v, time.Second, math.MaxInt64); err == nil {
			t.Errorf("WholeSeconds(%d) accepted", v)
		} else {
			refused(t, err, "timeout_seconds")
		}
	}
	if d, err := WholeSeconds("t", int64(MaxDuration/time.Second), time.Second, math.MaxInt64); err != nil || d != MaxDuration {
		t.Fatalf("the longest whole seconds: %v, %v", d, err)
	}
	for _, v := range []int64{-1, math.MaxInt64, 9223372036855} {
		if _, err := Millis("timeout_ms", v, 0, math.MaxInt64); err == nil {
			t.Errorf("Millis(%d) accepted", v)
		} else {
			refused(t, err, "timeout_ms")
		}
	}
}

func TestIntFloatParse(t *testing.T) {
	t.Parallel()
	refused(t, Int("limit", -1, 0, 10), "limit")
	refused(t, Int("limit", math.MaxInt64, 0, 10), "limit")
	for _, v := range []float64{math.NaN(), math.Inf(1), -1, 1025} {
		refused(t, Float("max_cpus", v, 0, MaxCPUs), "max_cpus")
	}
	for _, s := range []string{"", "zzz", "1e3", "9223372036854775808", "-1", "11", strings.Repeat("9", 1000)} {
		if _, err := ParseInt("limit", s, 0, 10); err == nil {
			t.Errorf("ParseInt(%q) accepted", s)
		} else {
			refused(t, err, "limit")
		}
	}
	if n, err := ParseInt("limit", "10", 0, 10); n != 10 || err != nil {
		t.Fatalf("ParseInt(10) = %d, %v", n, err)
	}
}

func TestAddSaturates(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ a, b, want int64 }{
		{math.MaxInt64, 1, math.MaxInt64}, {math.MinInt64, -1, math.MinInt64},
		{math.MaxInt64, math.MinInt64, -1}, {5, -7, -2}, {MaxAmountMicros, MaxAmountMicros, 2 * MaxAmountMicros},
	} {
		if got := Add(c.a, c.b); got != c.want {
			t.Errorf("Add(%d, %d) = %d, want %d", c.a, c.b, got, c.want)
		}
	}
	if Clamp(math.NaN(), 0, 5) != 0 || Clamp(int64(math.MaxInt64), 0, 5) != 5 || Clamp(-3.0, 0, 5) != 0 {
		t.Fatal("Clamp")
	}
}

// TestMaximaDoNotOverflow: what the maxima are chosen for.
func TestMaximaDoNotOverflow(t *testing.T) {
	t.Parallel()
	if MaxMB<<20 <= 0 || MaxMB<<20 > math.MaxInt64/4 {
		t.Fatal("MaxMB in bytes overflows")
	}
	if time.Duration(math.MaxInt64)-2*MaxDuration < 250*365*24*time.Hour {
		t.Fatal("now plus two MaxDurations leaves too little")
	}
	if math.MaxInt64/MaxAmountMicros < 9000 || math.MaxInt64/MaxCount < 9000 {
		t.Fatal("amounts or counts overflow summed 9,000 times")
	}
	if float64(MaxCount) > 1<<53 {
		t.Fatal("MaxCount is not exact in a float64")
	}
}
