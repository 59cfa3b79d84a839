package kernel

import (
	"context"
	"strings"
	"testing"

	"github.com/sheepfold/sheepfold/internal/agentproto"
)

// TestEventOrder checks that output written before a result arrives before
// it, although the two travel on different pipes. (Output written after a
// result may overtake it: the guarantee is one way.)
func TestEventOrder(t *testing.T) {
	t.Parallel()
	for lang, src := range map[string]string{
		"python":     "print('a')\ndisplay(1)\nprint('b', end='')\n2",
		"javascript": "console.log('a'); 1",
	} {
		k := start(t, lang, nil)
		want := map[string]string{"python": "stdout:a\n result:1 stdout:b result:2", "javascript": "stdout:a\n result:1"}[lang]
		if lang == "python" {
			// A sleep after each result keeps later output from overtaking it.
			src = "import time\nprint('a')\ndisplay(1); time.sleep(0.01)\nprint('b', end='')\n2"
		}
		for i := 0; i < 30; i++ {
			var seq []string
			k.Execute(context.Background(), code(src), func(ev agentproto.Event) error {
				switch ev.Type {
				case agentproto.EventStdout:
					seq = append(seq, "stdout:"+string(ev.Data))
				case agentproto.EventResult:
					seq = append(seq, "result:"+ev.Result.Text)
				}
				return nil
			})
			if got := strings.Join(seq, " "); got != want {
				t.Fatalf("%s run %d: events %q, want %q", lang, i, got, want)
			}
		}
	}
}
