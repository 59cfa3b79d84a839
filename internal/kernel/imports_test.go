package kernel

import (
	"strings"
	"testing"

	"github.com/sheepfold/sheepfold/internal/agentproto"
	"github.com/sheepfold/sheepfold/internal/policy"
)

// importBypasses are ways round the import rules that earlier versions
// let through: the C-level twins of blocked modules, the import system's
// finders, loaders and C functions called directly, helpers that import a
// name they are given, and code that claims a library's or a frozen
// origin. Each works in a kernel without rules.
var importBypasses = []struct {
	name, code string
	target     string // the module_blocked report's target (a prefix)
}{
	{"posix for os", "import posix\nposix.getpid()", "posix"},
	{"_socket for socket", "import _socket\n_socket.socket().close()", "_socket"},
	{"_posixsubprocess for subprocess", "import _posixsubprocess\n_posixsubprocess.fork_exec", "_posixsubprocess"},
	{"_ctypes for ctypes", "import _ctypes\n_ctypes.dlopen(None, 2)", "_ctypes"},
	{"spec and exec_module", "import importlib.util, importlib.machinery\nspec = importlib.machinery.PathFinder.find_spec('socket')\n" +
		"m = importlib.util.module_from_spec(spec)\nimport sys\nsys.modules['socket'] = m\nspec.loader.exec_module(m)\nm.socket().close()", "socket"},
	{"a renamed spec", "import importlib.util, importlib.machinery\npath = importlib.machinery.PathFinder.find_spec('socket').origin\n" +
		"loader = importlib.machinery.SourceFileLoader('harmless', path)\nspec = importlib.util.spec_from_loader('harmless', loader)\n" +
		"m = importlib.util.module_from_spec(spec)\nimport sys\nsys.modules['harmless'] = m\nloader.exec_module(m)\nm.socket().close()", "socket"},
	{"the builtin importer", "import importlib.util, importlib.machinery\nspec = importlib.machinery.BuiltinImporter.find_spec('_socket')\n" +
		"m = importlib.util.module_from_spec(spec)\nm.socket().close()", "_socket"},
	{"_imp.create_builtin", "import _imp, importlib.machinery\nm = _imp.create_builtin(importlib.machinery.ModuleSpec('_socket', None))\n" +
		"m.socket().close()", "_socket"},
	{"importlib.util.find_spec", "import importlib.util\nimportlib.util.find_spec('socket').name", "socket"},
	{"a loader's code run by hand", "import importlib.machinery\npath = importlib.machinery.PathFinder.find_spec('socket').origin\n" +
		"code = importlib.machinery.SourceFileLoader('socket', path).get_code('socket')\nimport sys, types\nm = types.ModuleType('socket')\n" +
		"sys.modules['socket'] = m\nexec(code, m.__dict__)\nm.socket().close()", ""},
	{"a loader of the user's handing over code as a library file's", "import importlib.util, importlib.machinery, marshal, sys\n" +
		"path = importlib.machinery.PathFinder.find_spec('json').origin\n" +
		"code = marshal.loads(marshal.dumps(compile('import socket\\ns = socket.socket()', 'X' * len(path), 'exec')).replace(b'X' * len(path), path.encode()))\n" +
		"class L(importlib.machinery.SourceFileLoader):\n    def get_code(self, name): return code\n" +
		"loader = L('harmless', path)\nspec = importlib.util.spec_from_loader('harmless', loader)\nm = importlib.util.module_from_spec(spec)\n" +
		"sys.modules['harmless'] = m\nloader.exec_module(m)\nm.s.close()", "run "},
	// mimetypes imports winreg if there is one (on Windows): a library's
	// own import, which finds what the user wrote.
	{"bytecode made as a library file's, imported by a library", forgedWinreg + "open('winreg.pyc', 'wb').write(pyc)\n" +
		"import mimetypes\nassert mimetypes._winreg is not None, 'blocked by security policy'\nmimetypes._winreg.s.socket().close()", "run "},
	{"the same from a zip archive", forgedWinreg + "import zipfile, sys\nwith zipfile.ZipFile('forged.zip', 'w') as z:\n    z.writestr('winreg.pyc', pyc)\n" +
		"sys.path.insert(0, 'forged.zip')\nimport mimetypes\nassert mimetypes._winreg is not None, 'blocked by security policy'\n" +
		"mimetypes._winreg.s.socket().close()", "run "},
	{"pkgutil.resolve_name", "import pkgutil\npkgutil.resolve_name('socket:socket')().close()", "socket"},
	{"pydoc.locate", "import pydoc\npydoc.locate('socket.socket')().close()", "socket"},
	{"pickle's Python unpickler", "import pickle\npickle._loads(b'csocket\\nsocket\\n.')().close()", "socket"},
	{"a helper as a thread's target", "import importlib, concurrent.futures as cf\nwith cf.ThreadPoolExecutor(1) as p:\n" +
		"    p.submit(importlib.import_module, 'socket').result().socket().close()", "socket"},
	{"the driver's own helper", "display.__globals__['_preload'](['socket'])\nimport sys\nsys.modules['socket'].socket().close()", "socket"},
	{"a code object claiming a frozen origin", "c = compile('import socket\\nsocket.socket().close()', '<x>', 'exec')" +
		".replace(co_filename='<frozen sheepfold_driver>')\nexec(c)", "socket"},
	{"a code object renamed as a library file", "c = compile('import socket\\nsocket.socket().close()', '<x>', 'exec')" +
		".replace(co_filename='/usr/lib/python3.11/harmless.py')\nexec(c)", "compile as /usr/lib/python3.11/harmless.py"},
	{"marshal made as a library file", "import marshal\nlib = '/usr/lib/python3.11/harmless.py'\n" +
		"b = marshal.dumps(compile('import socket\\nsocket.socket().close()', 'X' * len(lib), 'exec'))\n" +
		"exec(marshal.loads(b.replace(b'X' * len(lib), lib.encode())))", "run /usr/lib/python3.11/harmless.py"},
	{"a function given library code", "import marshal\nlib = '/usr/lib/python3.11/harmless.py'\n" +
		"exec(compile('def g():\\n    import socket\\n    return socket.socket()', 'X' * len(lib), 'exec'))\n" +
		"def f(): pass\nf.__code__ = marshal.loads(marshal.dumps(g.__code__).replace(b'X' * len(lib), lib.encode()))\nf().close()",
		"run /usr/lib/python3.11/harmless.py"},
}

// forgedWinreg makes pyc, the bytecode of a module (winreg) that imports
// socket, made under a library file's name.
const forgedWinreg = "import marshal, importlib.util\nlib = '/usr/lib/python3.11/harmless.py'\n" +
	"code = marshal.loads(marshal.dumps(compile('import socket as s', 'X' * len(lib), 'exec')).replace(b'X' * len(lib), lib.encode()))\n" +
	"pyc = importlib.util.MAGIC_NUMBER + bytes(12) + marshal.dumps(code)\n"

// bypassPolicy blocks what a hostile cell wants, as the engine sends it
// (the C-level twins added).
func bypassPolicy() *agentproto.KernelPolicy {
	return &agentproto.KernelPolicy{BlockedModules: policy.WithTwins([]string{"os", "subprocess", "socket", "ctypes"}), AllowNetwork: true}
}

// TestPythonImportBypasses runs each bypass in a kernel without rules
// (where it must work) and in one with them (where it must be refused with
// ModuleBlockedError and a module_blocked report).
func TestPythonImportBypasses(t *testing.T) {
	t.Parallel()
	for _, c := range importBypasses {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			free := start(t, "python", nil)
			if r := run(t, free, code(c.code)); r.done.Status != agentproto.StatusOK || r.err != nil {
				t.Fatalf("unconfined, the bypass must work: %v", r)
			}
			k := start(t, "python", nil)
			r, vs := violations(t, k, withPolicy(c.code, bypassPolicy()))
			// Helpers may wrap the refusal in an error of their own.
			if r.done.Status != agentproto.StatusError || r.err == nil ||
				r.err.Name != "ModuleBlockedError" && !strings.Contains(r.err.Value, "blocked by security policy") {
				t.Fatalf("confined: %v", r)
			}
			if len(vs) == 0 || vs[0].Kind != "module_blocked" || !strings.HasPrefix(vs[0].Target, c.target) {
				t.Fatalf("violations %+v, want module_blocked %s", vs, c.target)
			}
		})
	}
}

// TestPythonLibrariesImportForThemselves: under the same rules, libraries
// still import what they need (os, socket, subprocess), also lazily inside
// their functions and through helpers naming their own dependencies; the
// user's cells and their own modules are bound by the rules.
func TestPythonLibrariesImportForThemselves(t *testing.T) {
	t.Parallel()
	k := start(t, "python", nil)
	cells := []string{
		"import json, pathlib, tempfile, shutil, uuid\nshutil.which('sh') is not None and len(str(uuid.uuid4())) == 36 and tempfile.gettempdir() != ''",
		// logging.handlers imports socket for itself.
		"import logging.handlers\nlogging.handlers.SysLogHandler.__name__ == 'SysLogHandler'",
		// platform runs uname with subprocess when it must: its import is its own.
		"import platform\nplatform.machine() != ''",
		// importlib.import_module by a library, of a module its code names.
		"import importlib, json\nimportlib.import_module('json.decoder').__name__ == 'json.decoder'",
	}
	for i, c := range cells {
		var r record
		if i == 0 {
			r, _ = violations(t, k, withPolicy(c, bypassPolicy()))
		} else {
			r = run(t, k, code(c))
		}
		if main(r) != "True" {
			t.Fatalf("cell %d: %v", i, r)
		}
	}
	if r := run(t, k, code("import socket")); r.err == nil || r.err.Name != "ModuleBlockedError" {
		t.Fatalf("the user's own import: %v", r)
	}
	if r := run(t, k, code("import sys\n'socket' in sys.modules")); main(r) != "True" {
		t.Fatalf("logging.handlers loaded socket for itself: %v", r)
	}
}
