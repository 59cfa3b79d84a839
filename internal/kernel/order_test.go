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
		"javascript": "console.log('a'); console.log('b'); 1",
	} {
		k := start(t, lang, nil)
		for i := 0; i < 30; i++ {
			var before, stdout strings.Builder // stdout before the first result, and all of it
			var results []string
			k.Execute(context.Background(), code(src), func(ev agentproto.Event) error {
				switch ev.Type {
				case agentproto.EventStdout:
					stdout.Write(ev.Data)
					if len(results) == 0 {
						before.Write(ev.Data)
					}
				case agentproto.EventResult:
					results = append(results, ev.Result.Text)
				}
				return nil
			})
			if !strings.HasPrefix(before.String(), "a\n") || !strings.HasPrefix("a\nb\n", stdout.String()) ||
				len(results) == 0 || results[0] != "1" {
				t.Fatalf("%s run %d: stdout before the first result %q, all %q, results %q", lang, i, before.String(), stdout.String(), results)
			}
		}
	}
}
