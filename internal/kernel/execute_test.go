package kernel

import (
	"slices"
	"strings"
	"testing"

	"github.com/sheepfold/sheepfold/internal/agentproto"
)

// TestExecuteStates: each way an execution can go visits the states its
// diagram names, in order, and ends with the outcome of that way.
func TestExecuteStates(t *testing.T) {
	t.Parallel()
	k := start(t, "python", nil)
	var states []string
	k.onState = func(s execState) { states = append(states, s.String()) }
	full := []string{"admit", "ready", "send", "run", "finish"}
	for _, tc := range []struct {
		name   string
		before func()
		spec   agentproto.ExecuteSpec
		want   []string
		status string
		code   string
	}{
		{name: "ok", spec: code("1 + 1"), want: full, status: agentproto.StatusOK},
		{name: "error", spec: code("1 / 0"), want: full, status: agentproto.StatusError},
		{name: "timeout", spec: agentproto.ExecuteSpec{Code: "while True: pass", TimeoutMS: 200}, want: full, status: agentproto.StatusTimeout},
		{name: "died", spec: code("import os; os._exit(3)"), want: full, status: agentproto.StatusKilled},
		{name: "restarted after death", spec: code("2"), want: full, status: agentproto.StatusOK},
		{name: "the request cannot be written", before: func() { k.p.ctlW.Close() }, spec: code("1"),
			want: []string{"admit", "ready", "send"}, status: agentproto.StatusKilled},
		{name: "closed", before: func() { k.Close() }, spec: code("1"), want: []string{"admit"}, code: agentproto.CodeNotFound},
	} {
		if tc.before != nil {
			tc.before()
		}
		states = nil
		r := run(t, k, tc.spec)
		if !slices.Equal(states, tc.want) || r.done.Status != tc.status || r.done.Code != tc.code {
			t.Errorf("%s: states %s, status %q, code %q; want %s, %q, %q", tc.name, strings.Join(states, " → "),
				r.done.Status, r.done.Code, strings.Join(tc.want, " → "), tc.status, tc.code)
		}
	}
	// A refusal: preloading modules needs a python context.
	b := start(t, "bash", nil)
	states = nil
	b.onState = k.onState
	r := run(t, b, agentproto.ExecuteSpec{Code: "true", Preload: []string{"numpy"}})
	if !slices.Equal(states, []string{"admit"}) || r.done.Code != agentproto.CodeUnsupported {
		t.Errorf("refused: states %v, done %+v", states, r.done)
	}
}
