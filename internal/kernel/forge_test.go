package kernel

import (
	"fmt"
	"testing"
	"time"

	"github.com/sheepfold/sheepfold/internal/agentproto"
)

// Hostile cells that write the driver's end-of-execution message
// themselves: what the driver says is the sandbox's word (docs/security.md,
// section 7), so nothing the kernel keeps may depend on it alone.

// forgeEnd is code that ends its execution early and goes on running, per
// language: it closes its stdout and stderr (the kernel reads their end as
// the end of the execution's output), writes "done" on the control pipe,
// and then runs then.
var forgeEnd = map[string]string{
	"python": "import os, sys\nsys.stdout.flush(); sys.stderr.flush()\nos.close(1); os.close(2)\n" +
		"os.write(4, b'{\"type\":\"done\"}\\n')\n%s\n",
	// Node's driver writes the marker after the cell: fds 1 and 2 are
	// opened again on /dev/null, so that it does not fail.
	"javascript": "const fs = require('fs'); fs.closeSync(1); fs.closeSync(2);\n" +
		"fs.openSync('/dev/null', 'w'); fs.openSync('/dev/null', 'w');\nfs.writeSync(4, '{\"type\":\"done\"}\\n');\n%s\n",
}

// TestForgedEndClosedPipes: an execution whose code closed its stdout and
// stderr and wrote "done" ends there (the attack works: the kernel cannot
// tell), and the next execution replaces the interpreter, whose pipes
// ended, instead of waiting for output from them forever (it spun on the
// closed output channel with the kernel's lock held, so that the context
// could not even be deleted).
func TestForgedEndClosedPipes(t *testing.T) {
	t.Parallel()
	block := map[string]string{"python": "import threading\nthreading.Event().wait()",
		"javascript": "setInterval(() => {}, 1 << 30);"}
	for lang, forge := range forgeEnd {
		k := start(t, lang, nil)
		r := run(t, k, code(fmt.Sprintf(forge, block[lang])))
		if r.done.Status != agentproto.StatusOK {
			t.Fatalf("%s: the forged end did not end the execution: %v", lang, r)
		}
		next := make(chan record, 1)
		go func() { next <- run(t, k, code("1 + 1")) }()
		select {
		case r = <-next:
		case <-time.After(20 * time.Second):
			panic(lang + ": the execution after a forged end with closed pipes does not end")
		}
		if main(r) != "2" {
			t.Fatalf("%s: after a forged end with closed pipes: %v", lang, r)
		}
	}
}
