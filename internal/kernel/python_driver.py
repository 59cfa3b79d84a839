# Sheepfold Python kernel driver: requests arrive as JSON lines on fd 3,
# messages leave as JSON lines on fd 4; stdout and stderr are the real fds.
# It runs compiled as "<frozen sheepfold_driver>" (kernel.go's pythonBoot),
# so that the policy hooks below count its frames as the interpreter's own.
# Only what every execution needs is imported here: each import is on the
# path of a new context's first execution (subprocess and re load when a
# cell uses a shell escape, traceback when one raises). resource is here
# because every context's first execution applies a policy and needs it:
# loaded later, into a warm pool member that holds pandas, numpy and
# matplotlib, the same import cost 2-5 ms of CPU on its first execution.
import ast, binascii, builtins, io, json, linecache, os, resource, signal, sys


def _b64(data):
    return binascii.b2a_base64(data, newline=False).decode()

_ctl_in = os.fdopen(3, "r", encoding="utf-8")
_ctl_out = os.fdopen(4, "w", encoding="utf-8")
try:
    os.set_inheritable(5, False)  # where a seccomp listener goes (_seccomp)
except OSError:
    pass
_MAX_RESULT = 3_500_000
_globals = {"__name__": "__main__", "__builtins__": builtins}
# The chart describer's source (python_charts.py) arrives as argv[1]; it is
# compiled the first time a figure is rendered.
_charts_src = sys.argv.pop(1) if len(sys.argv) > 1 else ""
_charts = None


def _in_extension_init(frame):
    """Whether frame runs under a C extension module's initialisation
    (ExtensionFileLoader.create_module or exec_module on the stack): one
    that a KeyboardInterrupt cuts off may stay half-initialised for the
    life of the interpreter (Cython modules hand back the same module
    object on the next import, and skip its initialisation)."""
    while frame is not None:
        code = frame.f_code
        if code.co_name in ("create_module", "exec_module") and code.co_filename.startswith("<frozen importlib"):
            if type(frame.f_locals.get("self")).__name__ == "ExtensionFileLoader":
                return True
        frame = frame.f_back
    return False


def _on_sigint(signum, frame):
    """SIGINT (a timeout, the output cap, an interrupt) raises
    KeyboardInterrupt, except inside the import system's own code (where it
    could leave a module lock taken, or be swallowed by a weakref callback)
    and inside an extension module's initialisation: there it is put off
    and tried again every 10 ms from a helper thread, until that is done
    (the agent kills the interpreter if it takes longer than its grace).
    A retry is dropped once its execution has ended, and a SIGINT between
    executions is ignored: neither may reach the driver's loop or the next
    execution."""
    running = _running[0]
    if not running:
        return
    if frame is not None and (frame.f_code.co_filename.startswith("<frozen importlib") or _in_extension_init(frame)):
        if not _sigint_retry[0]:
            _sigint_retry[0] = True
            import _thread, time

            def retry(pid=os.getpid()):
                time.sleep(0.01)
                _sigint_retry[0] = False
                if _running[0] == running:
                    os.kill(pid, signal.SIGINT)

            _thread.start_new_thread(retry, ())
        return
    raise KeyboardInterrupt


_running = [0]  # the number of the execution running (0: none)
_sigint_retry = [False]  # a retry of a put-off SIGINT is pending
signal.signal(signal.SIGINT, _on_sigint)
# Line-buffered stdout and stderr: a print() arrives as one chunk, and
# partial lines are flushed at the end of every execution.
sys.stdout = io.TextIOWrapper(io.BufferedWriter(io.FileIO(1, "w", closefd=False)), encoding="utf-8",
                              errors="backslashreplace", line_buffering=True)
sys.stderr = io.TextIOWrapper(io.BufferedWriter(io.FileIO(2, "w", closefd=False)), encoding="utf-8",
                              errors="backslashreplace", line_buffering=True)


def _clip(s, n):
    return s if len(s) <= n else s[:n] + "... [%d characters cut]" % (len(s) - n)


def _send(msg):
    """Write one message; one too large for the protocol is cut (an error's
    text) or replaced by a "dropped" message saying how large it was."""
    line = json.dumps(msg, default=str)
    if len(line) > _MAX_RESULT and msg.get("type") == "error":
        e = msg["error"]
        e["value"] = _clip(e.get("value", ""), 65536)
        e["traceback"] = _clip(e.get("traceback", ""), 524288)
        line = json.dumps(msg, default=str)
    if len(line) > _MAX_RESULT:
        line = json.dumps({"type": "dropped", "what": msg.get("type"), "bytes": len(line),
                           "limit": _MAX_RESULT})
    _ctl_out.write(line + "\n")
    _ctl_out.flush()


_MIME = [("_repr_html_", "html"), ("_repr_markdown_", "markdown"), ("_repr_svg_", "svg"),
         ("_repr_png_", "png"), ("_repr_jpeg_", "jpeg"), ("_repr_latex_", "latex"),
         ("_repr_json_", "json"), ("_repr_javascript_", "javascript")]


def _result(value, main):
    r = {}
    if not isinstance(value, type):
        for meth, key in _MIME:
            f = getattr(value, meth, None)
            if not callable(f):
                continue
            try:
                out = f()
            except Exception:
                continue
            if isinstance(out, tuple):
                out = out[0]
            if out is None:
                continue
            if key in ("png", "jpeg") and isinstance(out, (bytes, bytearray)):
                out = _b64(out)
            r[key] = out
    try:
        r["text"] = repr(value)
    except Exception as e:
        r["text"] = "<unrepresentable %s: %s>" % (type(value).__name__, e)
    data = _frame_data(value)
    if data is not None:
        r["extra"] = {"e2b/data": data}
    if main:
        r["is_main_result"] = True
    _emit_result(r)


def _frame_data(value):
    """A pandas DataFrame as E2B's "data" rendering: its columns as lists
    (to_dict(orient="list")), timestamps in ISO 8601 as E2B gives them
    ("2024-01-02T00:00:00"), other values JSON can't hold as strings, NaN
    and infinities as null. None for anything else, and for a frame whose
    data would not leave room in one message for its other renderings."""
    pd = sys.modules.get("pandas")
    if pd is None or not isinstance(value, pd.DataFrame):
        return None

    def plain(v):
        if isinstance(v, pd.Timestamp):
            return v.isoformat()
        return str(v)

    try:
        s = json.dumps(value.to_dict(orient="list"), default=plain)
        if len(s) > _MAX_RESULT // 2:
            return None
        return json.loads(s, parse_constant=lambda _: None)
    except Exception:
        return None


def _emit_result(r):
    try:  # output written before the result goes out before it
        sys.stdout.flush()
        sys.stderr.flush()
    except Exception:
        pass
    _send({"type": "result", "result": r})


def display(*objs):
    for o in objs:
        _result(o, False)


builtins.display = display


def _chart(fig):
    global _charts
    try:
        if _charts is None:
            _charts = {"__name__": "_sheepfold_charts"}
            exec(compile(_charts_src, "<frozen sheepfold_charts>", "exec"), _charts)
        return _charts["chart"](fig)
    except Exception:
        return None


def _figures(*_args, **_kwargs):
    """Emit every open matplotlib figure as a PNG result (with its chart
    data) and close it: at plt.show() and at the end of each execution."""
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is None:
        return
    try:
        for num in plt.get_fignums():
            fig = plt.figure(num)
            buf = io.BytesIO()
            fig.savefig(buf, format="png", bbox_inches="tight")
            r = {"png": _b64(buf.getvalue()), "text": repr(fig)}
            c = _chart(fig)
            if c is not None:
                r["extra"] = {"e2b/chart": c}
            _emit_result(r)
        plt.close("all")
    except Exception as e:
        sys.stderr.write("sheepfold: could not render figures: %s\n" % e)


def _patch_pyplot(module):
    """plt.show() emits the figures, as a notebook's inline backend does."""
    module.show = _figures


def _patch_pil(module):
    """As in E2B's sandbox: image.show() displays the image (no viewer is
    started) and image.save() to a file name displays it too."""
    cls = getattr(module, "Image", None)
    if cls is None:
        return
    save = cls.save

    def show(self, title=None, **options):
        display(self)

    def save_and_display(self, fp, format=None, **params):
        if isinstance(fp, str):
            display(self)
        return save(self, fp, format, **params)

    cls.show = show
    cls.save = save_and_display


class _ImportHook:
    """Patches a module of a library the first time it is imported (see
    _PATCHES), wrapping its loader so that nothing is imported before the
    user's code asks for it."""

    def find_spec(self, name, path=None, target=None):
        patch = _PATCHES.get(name)
        if patch is None:
            return None
        import importlib.machinery
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def patched(module):
            exec_module(module)
            patch(module)
        spec.loader.exec_module = patched
        return spec


_PATCHES = {"matplotlib.pyplot": _patch_pyplot, "PIL.Image": _patch_pil}
sys.meta_path.insert(0, _ImportHook())
os.environ.setdefault("MPLBACKEND", "Agg")


def _shell(cmd):
    """IPython's !cmd: run a shell command, its output into stdout."""
    sys.stdout.flush()
    import subprocess
    p = subprocess.Popen(cmd, shell=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    for line in p.stdout:
        sys.stdout.write(line.decode("utf-8", "backslashreplace"))
    p.wait()


builtins._sheepfold_shell = _shell
_SHELL_LINE = r"^([ \t]*)!(.*)$"



# --- Security policy (the request's "policy", applied once per generation).
# These hooks are a convenience that makes refusals clear and reported; the
# boundary is below the interpreter (seccomp, namespaces, mounts, the
# network gateway). Rules only ever tighten inside one interpreter: the host
# restarts it to loosen one.
class ModuleBlockedError(ImportError):
    pass


class SubprocessDeniedError(PermissionError):
    pass


class NetworkRestrictedError(PermissionError):
    pass


builtins.ModuleBlockedError = ModuleBlockedError
builtins.SubprocessDeniedError = SubprocessDeniedError
builtins.NetworkRestrictedError = NetworkRestrictedError
_NET_MSG = "Network access is restricted in sandbox mode"
# _state[0]: whether non-loopback connections may be tried (the gateway
# decides them); mutable on purpose: it is not a boundary.
_state = [True, 0, False, False]  # allow_network, cpu_ms, net hook, subprocess hook


def _violation(kind, target):
    try:
        _send({"type": "violation", "kind": kind, "target": str(target)[:300]})
    except Exception:
        pass


def _loopback(host):
    if not isinstance(host, str):
        return False
    h = host.lower()
    return h in ("localhost", "::1", "0:0:0:0:0:0:0:1") or h.startswith("127.") or h.startswith("::ffff:127.")


def _numeric(host):
    # An address, not a name: IPv6 (names have no ':') or dotted IPv4.
    return ":" in host or host.strip("0123456789.") == ""


def _net_hook(event, args):
    if _state[0]:
        return
    if event in ("socket.getaddrinfo", "socket.gethostbyname", "socket.gethostbyname_ex"):
        # A name is refused at its resolution, as clearly as a connection
        # (the sandbox has no resolver to ask anyway).
        host = args[0] if args else None
        if isinstance(host, bytes):
            host = host.decode("idna", "replace")
        if isinstance(host, str) and host and not _loopback(host) and not _numeric(host) \
                and host != os.uname().nodename:
            _violation("network_denied", host)
            raise NetworkRestrictedError(_NET_MSG)
        return
    if event not in ("socket.connect", "socket.sendto", "socket.sendmsg"):
        return
    addr = args[1] if len(args) > 1 else None
    if event == "socket.sendmsg" and (addr is None or addr == ()):
        return  # a connected socket: its connect was checked
    if isinstance(addr, tuple) and len(addr) >= 2 and not _loopback(addr[0]):
        _violation("network_denied", "%s:%s" % (addr[0], addr[1]))
        raise NetworkRestrictedError(_NET_MSG)


_SPAWN_EVENTS = frozenset(("subprocess.Popen", "os.system", "os.posix_spawn", "os.exec", "os.spawn",
                           "os.fork", "os.forkpty", "pty.spawn", "os.startfile"))
_SPAWN_SYMBOLS = frozenset(("fork", "vfork", "_Fork", "clone", "clone3", "execve", "execveat", "fexecve", "execv",
                            "execvp", "execvpe", "execl", "execlp", "execle", "system", "popen", "posix_spawn",
                            "posix_spawnp"))


def _subprocess_hook(event, args):
    if event in _SPAWN_EVENTS:
        target = event
        if args:
            a = args[0] if event != "os.posix_spawn" else args[1] if len(args) > 1 else args[0]
            target = "%s: %s" % (event, a if isinstance(a, (str, bytes)) else " ".join(map(str, a)) if isinstance(a, (list, tuple)) else a)
        _violation("subprocess_denied", target)
        raise SubprocessDeniedError("Running programs and creating processes is blocked by security policy (%s)" % event)
    if event == "ctypes.dlsym" and len(args) > 1 and args[1] in _SPAWN_SYMBOLS:
        _violation("subprocess_denied", "ctypes: " + str(args[1]))
        raise SubprocessDeniedError("Running programs and creating processes is blocked by security policy (ctypes %s)" % args[1])


def _seccomp(prog, nr):
    """Install the no-subprocess filter on every thread of this process and
    hand its listener to the agent over fd 5, which answers each refused
    call with EPERM and reports it. Our copy of the listener is closed
    before any user code runs under the filter; were the agent gone, the
    kernel fails those calls with ENOSYS."""
    import ctypes, socket
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    buf = ctypes.create_string_buffer(prog, len(prog))

    class _Fprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
    fprog = _Fprog(len(prog) // 8, ctypes.addressof(buf))
    if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS (already set for the sandbox)
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    # SECCOMP_SET_MODE_FILTER with SECCOMP_FILTER_FLAG_TSYNC | NEW_LISTENER | TSYNC_ESRCH
    fd = libc.syscall(nr, 1, 1 | 8 | 16, ctypes.byref(fprog))
    if fd < 0:
        raise OSError(ctypes.get_errno(), "seccomp(SECCOMP_SET_MODE_FILTER)")
    try:
        s = socket.socket(fileno=5)
        try:
            socket.send_fds(s, [b"L"], [fd])
        finally:
            s.close()
    except OSError:
        pass  # no supervisor: the calls fail with ENOSYS, unreported
    finally:
        os.close(fd)


def _library_prefixes():
    out = {"<frozen "}
    for base in {sys.prefix, sys.base_prefix, sys.exec_prefix}:
        for lib in ("/lib/python3", "/lib64/python3"):
            out.add(base + lib)
    return tuple(sorted(out))


def _import_rules(allowed, blocked, deny_system):
    """Wrap __import__ (and importlib.import_module) so that imports made by
    the user's code (cells, exec'd strings, the user's own files: code that
    is not the interpreter's library) obey the rules. What a library imports
    for itself is not checked. The wrappers stack: each new rule set wraps
    the last, so rules only ever tighten. Everything the checks use is bound
    here, so replacing builtins later changes nothing."""
    lib = _library_prefixes()
    if deny_system:
        blocked = blocked | {"importlib", "imp", "_imp", "_frozen_importlib", "_frozen_importlib_external",
                             "zipimport", "pkgutil", "runpy", "builtins", "gc", "ctypes", "_ctypes", "marshal"}
    getframe, _getattr, _isinstance, _str, _type, _range = sys._getframe, getattr, isinstance, str, type, range
    module_type, violation, Blocked = _type(sys), _violation, ModuleBlockedError

    def denied(name):
        if not name:
            return False
        for m in blocked:
            if name == m or name.startswith(m + "."):
                return True
        if allowed is None:
            return False
        for m in allowed:
            if name == m or name.startswith(m + "."):
                return False
        return True

    def check(name, depth):
        if not denied(name):
            return
        if getframe(depth).f_code.co_filename.startswith(lib):
            return  # a library importing for itself
        violation("module_blocked", name)
        raise Blocked("Module '%s' is blocked by security policy" % name)

    def result(mod, depth):
        # sys.modules may have been poisoned: check what came back.
        real = _getattr(mod, "__name__", None)
        if _isinstance(real, _str):
            check(real, depth + 1)
        return mod

    prev_import = builtins.__import__

    def guarded_import(name, globals=None, locals=None, fromlist=(), level=0):
        if level == 0:
            check(name, 2)
        mod = prev_import(name, globals, locals, fromlist, level)
        if level == 0:
            result(mod, 2)
            if fromlist:
                for item in fromlist:
                    sub = _getattr(mod, item, None)
                    if _type(sub) is module_type:
                        result(sub, 2)
        return mod

    builtins.__import__ = guarded_import
    import importlib
    prev_module = importlib.import_module

    def import_module(name, package=None):
        if not name.startswith("."):
            check(name, 2)
        return result(prev_module(name, package), 2)

    importlib.import_module = import_module
    importlib.__import__ = guarded_import
    introspection = frozenset(("gc.get_objects", "gc.get_referrers", "gc.get_referents", "sys._current_frames",
                               "sys.settrace", "sys.setprofile", "code.__new__", "function.__new__",
                               "marshal.loads", "marshal.load"))

    def audit(event, args):
        if event == "compile":
            # compile() under a library file's name would pass the
            # library test: only the import system itself may do that.
            if len(args) > 1 and _isinstance(args[1], _str) and args[1].startswith(lib) \
                    and not getframe(1).f_code.co_filename.startswith(lib):
                violation("module_blocked", "compile as " + args[1])
                raise Blocked("Compiling code as a library file is blocked by security policy")
        elif event == "import":
            # A first load that went round __import__ (importlib internals,
            # a loader called directly): look for the first caller that is
            # not the import system.
            if not (args and _isinstance(args[0], _str) and denied(args[0])):
                return
            for depth in _range(1, 64):
                try:
                    fn = getframe(depth).f_code.co_filename
                except ValueError:
                    return
                if fn.startswith("<frozen importlib"):
                    continue
                if not fn.startswith(lib):
                    violation("module_blocked", args[0])
                    raise Blocked("Module '%s' is blocked by security policy" % args[0])
                return
        elif deny_system and event in introspection:
            if event.startswith("gc.") or not getframe(1).f_code.co_filename.startswith(lib):
                violation("module_blocked", event)
                raise Blocked("%s is blocked by security policy (allow_import_system is false)" % event)

    sys.addaudithook(audit)


def _apply_policy(pol):
    _state[0] = bool(pol.get("allow_network"))
    _state[1] = int(pol.get("cpu_time_ms") or 0)
    if not _state[2]:
        _state[2] = True
        sys.addaudithook(_net_hook)
    if pol.get("deny_subprocess") and not _state[3]:
        _seccomp(binascii.a2b_base64(pol["seccomp"]), int(pol["seccomp_syscall"]))
        _state[3] = True
        sys.addaudithook(_subprocess_hook)
    allowed, blocked = pol.get("allowed_imports"), pol.get("blocked_modules")
    if allowed or blocked or pol.get("deny_import_system"):
        _import_rules(frozenset(allowed) if allowed else None, frozenset(blocked or ()), bool(pol.get("deny_import_system")))
    fsize = int(pol.get("file_size_bytes") or 0)
    if fsize > 0:
        cur = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
        if cur == resource.RLIM_INFINITY or fsize < cur:
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))


def _cpu_backstop():
    """RLIMIT_CPU past this execution's CPU time limit: if the agent's own
    watch fails, the kernel ends the interpreter. The soft limit is set
    ahead (used + 2 x limit + 2 s) and moved only when the next execution
    could reach it, so most executions make no system call for it."""
    import time
    limit = _state[1] / 1000.0
    hard = resource.getrlimit(resource.RLIMIT_CPU)[1] if _cpu[0] is None else _cpu[1]
    if limit <= 0:
        if _cpu[0] is not None:
            resource.setrlimit(resource.RLIMIT_CPU, (hard, hard))
            _cpu[0] = None
        return
    used = time.process_time()
    if _cpu[0] is None or used + limit + 2 > _cpu[0]:
        soft = int(used + 2 * limit) + 3
        if hard != resource.RLIM_INFINITY:
            soft = min(soft, hard)
        resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))
        _cpu[0], _cpu[1] = soft, hard


_cpu = [None, None]  # the soft RLIMIT_CPU set (None: the interpreter's own), the hard one


def _error(e):
    if isinstance(e, OSError) and e.errno in (27, 28, 122):  # EFBIG, ENOSPC, EDQUOT
        _violation("resource", "file_size" if e.errno == 27 else "disk")
    tb = e.__traceback__
    while tb is not None and not tb.tb_frame.f_code.co_filename.startswith("<cell"):
        tb = tb.tb_next
    try:
        import traceback
        if isinstance(e, SyntaxError):
            text = "".join(traceback.format_exception_only(type(e), e))
        else:
            text = "".join(traceback.format_exception(type(e), e, tb))
    except BaseException:  # e.g. no memory left to import with
        text = "%s: %s" % (type(e).__name__, e)
    _send({"type": "error", "error": {"name": type(e).__name__, "value": str(e), "traceback": text}})


def _dedent(code):
    """Remove the indentation of the cell's first non-blank line from every
    line that has it, as IPython does before it compiles a cell: a cell
    written inside an indented block (a template string, a triple-quoted
    string) runs as if it were written flush left."""
    lines = code.splitlines(True)
    for line in lines:
        if line.strip():
            indent = line[:len(line) - len(line.lstrip(" \t"))]
            break
    else:
        return code
    if not indent:
        return code
    return "".join(ln[len(indent):] if ln.startswith(indent) else ln for ln in lines)


def _run(code, n):
    code = _dedent(code)
    name = "<cell-%d>" % n
    linecache.cache[name] = (len(code), None, code.splitlines(True), name)
    try:
        tree = ast.parse(code, name, "exec")
    except SyntaxError:
        # A line starting with ! is a shell escape (never valid Python).
        import re
        shell = re.sub(_SHELL_LINE, lambda m: "%s_sheepfold_shell(%r)" % (m.group(1), m.group(2)), code, flags=re.M)
        if shell == code:
            raise
        tree = ast.parse(shell, name, "exec")
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    exec(compile(tree, name, "exec"), _globals)
    if last is not None:
        value = eval(compile(last, name, "eval"), _globals)
        if value is not None:
            _result(value, True)


def _preload(names):
    """Import modules into sys.modules only (the warm pool's "preload"
    request): no name is bound in the user's namespace and the execution
    count does not move."""
    import importlib
    failed = []
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as e:
            failed.append("%s (%s: %s)" % (name, type(e).__name__, e))
    _warm()
    if failed:
        raise ImportError("could not preload " + ", ".join(failed))


def _warm():
    """Run the first-use paths of the preloaded libraries once (pandas'
    CSV parser and groupby, a pandas bar chart drawn, described and
    closed), in this function's scope, so the user's first chart does not
    pay for font loading and lazy imports (pandas' matplotlib backend)."""
    pd = sys.modules.get("pandas")
    if pd is not None:
        try:
            pd.read_csv(io.StringIO("k,v\na,1\nb,2\n")).groupby("k").sum()
        except Exception:
            pass
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is not None:
        try:
            fig = plt.figure()
            ax = fig.add_subplot()
            if pd is not None:
                pd.Series([1, 2], index=["a", "b"]).plot(kind="bar", ax=ax, title="warm")
            else:
                ax.bar(["a", "b"], [1, 2])
                ax.set_title("warm")
            fig.savefig(io.BytesIO(), format="png", bbox_inches="tight")
            _chart(fig)
        except Exception:
            pass
        finally:
            plt.close("all")


def _drop_orphans():
    """After an execution that raised. An import that was cut off (a
    timeout's KeyboardInterrupt, a MemoryError) takes the modules it was
    running out of sys.modules, but not the submodules they had finished:
    those hold the cut-off package object, which never gets the rest of
    its names, and the next import of the package would run it again
    against them and fail ("partially initialized module"). Every module
    whose parent package is no longer loaded is dropped, so that the next
    import starts clean; modules imported whole are untouched."""
    mods = sys.modules
    gone = set()
    for name in sorted(mods):  # a package sorts before its submodules
        parent = name.rpartition(".")[0]
        if parent and (parent in gone or parent not in mods):
            gone.add(name)
    for name in gone:
        mods.pop(name, None)


def main():
    n = 0
    seq = 0
    for line in _ctl_in:
        req = json.loads(line)
        preload = req.get("preload")
        if preload is None:
            n += 1
        seq += 1
        _running[0] = seq
        pol = req.get("policy")
        policy_error = None
        try:
            if pol is not None:
                _apply_policy(pol)
            if pol is not None or _state[1]:
                _cpu_backstop()
        except BaseException as e:
            policy_error = e
            _send({"type": "policy_failed"})
        env = req.get("env") or {}
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            try:
                if policy_error is not None:
                    raise RuntimeError("could not apply the security policy: %s" % policy_error)
                if preload is not None:
                    _preload(preload)
                else:
                    _run(req["code"], n)
            finally:
                _figures()
        except BaseException as e:  # SystemExit and KeyboardInterrupt too: the kernel lives on
            try:
                _error(e)
            except BaseException:
                pass
            try:
                _drop_orphans()
            except BaseException:
                pass
        finally:
            _running[0] = 0
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            except BaseException:
                pass
            marker = ("\x1e" + req["marker"] + "\n").encode()
            os.write(1, marker)
            os.write(2, marker)
            _send({"type": "done"})


main()
