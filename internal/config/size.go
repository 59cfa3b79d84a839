package config

import (
	"fmt"
	"strconv"
	"strings"
)

// ParseSize reads a byte size: a plain number of bytes, or a number with
// a binary (KiB, MiB, GiB, TiB) or decimal (K/KB, M/MB, G/GB, T/TB) unit.
func ParseSize(s string) (int64, error) {
	t := strings.TrimSpace(s)
	i := 0
	for i < len(t) && (t[i] >= '0' && t[i] <= '9' || t[i] == '.') {
		i++
	}
	num, unit := t[:i], strings.ToLower(strings.TrimSpace(t[i:]))
	f, err := strconv.ParseFloat(num, 64)
	if err != nil || f < 0 {
		return 0, fmt.Errorf("invalid size %q: want e.g. 512MiB", s)
	}
	mult, ok := map[string]float64{
		"": 1, "b": 1,
		"k": 1e3, "kb": 1e3, "kib": 1 << 10,
		"m": 1e6, "mb": 1e6, "mib": 1 << 20,
		"g": 1e9, "gb": 1e9, "gib": 1 << 30,
		"t": 1e12, "tb": 1e12, "tib": 1 << 40,
	}[unit]
	if !ok {
		return 0, fmt.Errorf("invalid size %q: unknown unit %q", s, unit)
	}
	v := f * mult
	if v > 1<<62 {
		return 0, fmt.Errorf("invalid size %q: too large", s)
	}
	return int64(v), nil
}
