package oci

import "testing"

func TestParsePressure(t *testing.T) {
	some, full := parsePressure("some avg10=12.50 avg60=3.10 avg300=0.66 total=123456\nfull avg10=4.25 avg60=1.00 avg300=0.20 total=5678\n")
	if some != 12.5 || full != 4.25 {
		t.Errorf("parsed some %v full %v, want 12.5 4.25", some, full)
	}
	some, full = parsePressure("some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")
	if some != 0 || full != 0 {
		t.Errorf("cpu.pressure without full: %v %v", some, full)
	}
	if p := readPressure(t.TempDir()); p != nil {
		t.Errorf("no PSI files, yet %+v", p)
	}
}
