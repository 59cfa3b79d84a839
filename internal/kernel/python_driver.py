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
            code = compile(_charts_src, "<frozen sheepfold_charts>", "exec")
            _trust(code)  # import rules: the driver's own
            exec(code, _charts)
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
    ctypes, socket = _library_import("ctypes"), _library_import("socket")
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
    _landlock(libc, ctypes)
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


# --- Import rules (allowed_imports, blocked_modules, allow_import_system).
# A rule binds what the user's code asks for, by any route to the import
# system: import statements, __import__, importlib, the finders and loaders
# called directly (spec + exec_module), the import system's C functions
# (_imp), and helpers that import a name they are given (pkgutil, pydoc,
# pandas' import_optional_dependency...). It is checked where modules are
# found (a finder at the head of sys.meta_path) and where they are created
# and run (the source loaders' exec_module, _imp's create_builtin,
# create_dynamic, get_frozen_object and init_frozen), by the module's name
# and by the name its file has under sys.path; __import__ and
# importlib.import_module check modules already loaded too. Who asks
# decides: the stack is read outward past the import system and the
# helpers, and the first frame left is the asker. A library (a genuine
# frame of a file under the interpreter's library directories, of a frozen
# module, or of this driver) asks for itself and may import what it needs
# (pandas imports os); past a helper, only a name its own code writes (or
# a module of its own package) is its own, so a library calling a helper
# back for the user (a thread's target, Series.map(importlib.import_module))
# asks for the user. Code that claims a library's origin without being it
# (compiled, made with code.replace or renamed with _imp._fix_co_filename
# under a library file's name; any "<frozen ...>" name) is not trusted, and
# running a library's code outside the import system at the user's request
# (exec of what a loader's get_code or marshal gave, a function made from a
# library's code object) is refused; a loader vouches for the code it runs
# only when it is one of the import system's own file loaders. Not
# promised: a module already loaded is reachable through the attributes of
# others (pathlib.os), and code that can read closures, replace the import
# system's functions or write memory (ctypes) can undo these hooks.
# docs/security.md, section 4, says what the rules promise.

_HELPERS = (  # name-resolving helpers: (file suffix, function names; None: every function)
    ("/pkgutil.py", None), ("/pydoc.py", None), ("/runpy.py", None),
    ("/pickle.py", frozenset(("find_class",))),
    ("/logging/config.py", frozenset(("resolve", "_resolve"))),
    ("/unittest/mock.py", frozenset(("_importer", "_dot_lookup", "_get_target"))),
    ("/unittest/loader.py", frozenset(("loadTestsFromName",))),
    ("/doctest.py", frozenset(("_normalize_module",))),
    ("/warnings.py", frozenset(("_getcategory",))),
    ("/pandas/compat/_optional.py", frozenset(("import_optional_dependency",))),
)
_DRIVER = {}  # id -> code: the driver's own code objects (and the charts module's)


def _trust(code):
    """Count code, compiled by the driver, as the driver's own."""
    _code_tree(code, _DRIVER)


def _code_tree(code, into):
    """Add code and the code objects nested in it to into (id -> code: the
    objects are kept, so that no id is reused)."""
    stack = [code]
    while stack:
        c = stack.pop()
        if id(c) not in into:
            into[id(c)] = c
            stack.extend(k for k in c.co_consts if type(k) is type(c))


def _codes_of(objs, into, depth=0):
    """Add the code of the functions and classes among objs to into."""
    function = type(_code_tree)
    for v in objs:
        t = type(v)
        if t is staticmethod or t is classmethod:
            v = v.__func__
            t = type(v)
        if t is function:
            _code_tree(v.__code__, into)
        elif t is property:
            _codes_of([f for f in (v.fget, v.fset, v.fdel) if f is not None], into, depth)
        elif isinstance(v, type) and depth < 4:
            _codes_of(list(vars(v).values()), into, depth + 1)


def _library_import(name):
    """Import a module of the standard library with nothing but the
    interpreter's library directories on sys.path: the policy's own imports
    (before the filter is on) find no module the sandbox's code wrote."""
    mod = sys.modules.get(name)
    if mod is not None:
        return mod
    saved = sys.path[:]
    lib = _library_prefixes()
    sys.path[:] = [p for p in saved if isinstance(p, str) and p.startswith(lib)]
    try:
        import importlib
        return importlib.import_module(name)
    finally:
        sys.path[:] = saved


def _landlock(libc, ctypes):
    """Put this thread (the only one: the driver's, before user code runs
    under the filter) and what it starts in a Landlock domain of its own.
    It restricts nothing of the file system (the only access it handles,
    making block devices, the sandbox never has), but a process in a domain
    cannot reach processes outside it through ptrace's access check: it
    cannot open another process's /proc/PID/mem, fd/N, environ or maps, nor
    take its descriptors (pidfd_getfd), so it cannot make an unfiltered
    process of the same user (an idle context's interpreter, a command's
    process) start a process for it. Nothing is done where there is no
    Landlock (before Linux 5.13, or not enabled) or the runtime's seccomp
    profile refuses it: docs/security.md, section 3, says what is then not
    promised."""
    libc.syscall.restype = ctypes.c_long
    attr = ctypes.c_uint64(1 << 11)  # struct landlock_ruleset_attr: handled_access_fs = LANDLOCK_ACCESS_FS_MAKE_BLOCK
    fd = libc.syscall(444, ctypes.byref(attr), 8, 0)  # landlock_create_ruleset (the same number everywhere)
    if fd < 0:
        if ctypes.get_errno() in (1, 38, 95):  # EPERM (a runtime's seccomp profile), ENOSYS, EOPNOTSUPP
            return
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset")
    try:
        if libc.syscall(446, fd, 0) != 0:  # landlock_restrict_self
            raise OSError(ctypes.get_errno(), "landlock_restrict_self")
    finally:
        os.close(fd)


def _user_paths():
    """Once, after the first request's policy is applied: the working
    directory goes back at the head of sys.path and the user's site
    directory (with its .pth files and usercustomize) where Python puts it,
    as without -s (kernel.go's pythonBoot says why they were left out)."""
    if _paths_done[0]:
        return
    _paths_done[0] = True
    sys.path.insert(0, "")
    if os.environ.get("PYTHONNOUSERSITE") or os.getuid() != os.geteuid() or os.getgid() != os.getegid():
        return
    import site
    site.ENABLE_USER_SITE = True
    user = site.getusersitepackages()
    if os.path.isdir(user):
        before = set(sys.path)
        site.addsitedir(user)
        added = [p for p in sys.path if p not in before]
        rest = [p for p in sys.path if p in before]
        at = next((i for i, p in enumerate(rest) if isinstance(p, str) and p.rstrip("/").endswith(("site-packages", "dist-packages"))), len(rest))
        sys.path[:] = rest[:at] + added + rest[at:]
    site.execusercustomize()


_paths_done = [False]


def _library_prefixes():
    """The interpreter's library directories; never "<frozen ...>", a name
    any code can be given (frozen modules are told by their code objects)."""
    out = set()
    for base in {sys.prefix, sys.base_prefix, sys.exec_prefix}:
        for lib in ("/lib/python3", "/lib64/python3"):
            out.add(base + lib)
    try:
        import site
        out.update(p.rstrip("/") + "/" for p in site.getsitepackages())
    except Exception:
        pass
    return tuple(sorted(out))


def _import_rules(allowed, blocked, deny_system):
    """Add a rule set (allowed: None for any). The hooks are installed by
    the first call; each later call adds its rules to theirs, so rules only
    ever tighten."""
    if deny_system:
        blocked = blocked | {"importlib", "imp", "_imp", "_frozen_importlib", "_frozen_importlib_external",
                             "zipimport", "pkgutil", "runpy", "builtins", "gc", "ctypes", "_ctypes", "marshal"}
    if _rules_add[0] is None:
        _rules_add[0] = _import_hooks()
    _rules_add[0](allowed, blocked, deny_system)


_rules_add = [None]


def _import_hooks():
    """Install the hooks; return the function that adds a rule set.
    Everything the checks use is bound here, so replacing builtins or
    module attributes later changes nothing."""
    import _imp, importlib, _frozen_importlib as _bs, _frozen_importlib_external as _bse
    lib = _library_prefixes()
    rules = []  # (allowed or None, blocked)
    system = [False]  # allow_import_system: false was asked
    getframe, _getattr, _isinstance, _str, _type, _id, _tuple = sys._getframe, getattr, isinstance, str, type, id, tuple
    code_tree = _code_tree
    module_type, code_type, violation, Blocked = _type(sys), _type(_import_hooks.__code__), _violation, ModuleBlockedError
    machinery = {}  # the import system's code: skipped when looking for the asker
    for m in (_bs, _bse, sys.modules.get("zipimport")):
        if m is not None:
            _codes_of(list(vars(m).values()), machinery)
    frozen = {}  # frozen modules of the standard library (os, codecs, io...)
    for name, m in list(sys.modules.items()):
        if m not in (_bs, _bse) and not name.startswith("importlib") and \
                _getattr(_getattr(m, "__spec__", None), "origin", None) == "frozen":
            _codes_of(list(vars(m).values()), frozen)
    driver = _DRIVER
    mine = {}
    _codes_of([v for v in globals().values() if _getattr(v, "__module__", None) == __name__], mine)
    driver.update((i, c) for i, c in mine.items() if c.co_filename == "<frozen sheepfold_driver>")
    helpers = {}
    for f in (_preload, _shell):  # the driver's own helpers: they import for the user
        _code_tree(f.__code__, helpers)
    relays = {}  # id of a hook's code -> None, or "loader": its frame stands for the module it creates
    roots = sorted({p.rstrip("/") + "/" for p in sys.path if _isinstance(p, _str) and p.startswith(lib)}, key=len, reverse=True)

    def covered(name, names):
        if name in names:
            return True
        i = name.find(".")
        while i > 0:
            if name[:i] in names:
                return True
            i = name.find(".", i + 1)
        return False

    def denied(name):
        if not name or not _isinstance(name, _str):
            return False
        for allow, block in rules:
            if covered(name, block) or allow is not None and not covered(name, allow):
                return True
        return False

    path_names = {}

    def path_name(path):
        """The dotted module name of a library file under sys.path."""
        if not _isinstance(path, _str):
            return None
        got = path_names.get(path, path_names)
        if got is not path_names:
            return got
        got = None
        for root in roots:
            if path.startswith(root):
                parts = [p for p in path[len(root):].split("/") if p != "__pycache__"]
                parts[-1] = parts[-1].partition(".")[0]
                if parts[-1] == "__init__":
                    parts.pop()
                got = ".".join(parts) or None
                break
        if len(path_names) < 4096:
            path_names[path] = got
        return got

    def is_helper(c):
        if _id(c) in helpers:
            return True
        fn = c.co_filename
        if fn.startswith("<frozen importlib."):
            return True  # importlib.util, importlib.machinery (the genuine machinery is skipped before)
        if c.co_name == "<module>" or not fn.startswith(lib):
            return False
        if "/importlib/" in fn:
            return True
        for suffix, names in _HELPERS:
            if fn.endswith(suffix) and (names is None or c.co_name in names):
                return True
        return False

    def names_it(f, name):
        """Whether the library code of frame f writes module name itself
        (an import statement, a string) or belongs to its package."""
        own = f.f_globals.get("__name__")
        if _isinstance(own, _str) and own.partition(".")[0] == name.partition(".")[0]:
            return True
        c = f.f_code
        words = set(c.co_names)
        consts = list(c.co_consts)
        while consts:
            k = consts.pop()
            if _type(k) is _str:
                words.add(k)
            elif _type(k) is _tuple or _type(k) is frozenset:
                consts.extend(k)
        parent, _, last = name.rpartition(".")
        for w in words:
            if w == name or w.startswith(name + "."):
                return True
            if parent and last in words and (w == parent or w.startswith(parent + ".")):
                return True
        return False

    USER, OWN, HELPER, SKIP, LOADER = range(5)
    kinds = {}  # id of a code object -> (the code, its kind); the code is kept so that no id is reused

    def kind(c):
        i = _id(c)
        got = kinds.get(i)
        if got is not None:
            return got[1]
        if i in relays:
            k = LOADER if relays[i] is not None else SKIP
        elif i in machinery:
            k = SKIP
        elif is_helper(c):
            k = HELPER
        elif i in driver or i in frozen or c.co_filename.startswith(lib):
            k = OWN
        else:
            k = USER
        if len(kinds) < 65536:
            kinds[i] = (c, k)
        return k

    def users(f, name=None):
        """Whether the user's code asks (for module name), read from frame
        f outward."""
        helper = False
        while f is not None:
            k = kind(f.f_code)
            if k == LOADER:
                origin = f.f_locals.get("origin")
                if _isinstance(origin, _str):
                    # A loader's hook: the module it creates asks (a C
                    # module's initialisation has no frame of its own).
                    return not (origin.startswith(lib) or origin in ("built-in", "frozen"))
                k = SKIP  # a loader that cannot vouch for its module: its caller asks
            if k == SKIP:
                f = f.f_back
                continue
            if k == HELPER:
                helper = True
                f = f.f_back
                continue
            if k == OWN:
                return helper and (name is None or not names_it(f, name))
            return True
        return True  # only helpers: a thread started on one

    def refuse(name):
        violation("module_blocked", name)
        raise Blocked("Module '%s' is blocked by security policy" % name)

    def check(name, f):
        if denied(name) and users(f, name):
            refuse(name)

    def check_module(name, origin, f):
        """A module about to be found, created or run: by its name and by
        the name its file has under sys.path."""
        check(name, f)
        pname = path_name(origin)
        if pname and pname != name:
            check(pname, f)

    def result(mod, f):
        # sys.modules may have been poisoned: check what came back.
        real = _getattr(mod, "__name__", None)
        if _isinstance(real, _str):
            check(real, f)
        return mod

    prev_import = builtins.__import__

    def guarded_import(name, globals=None, locals=None, fromlist=(), level=0):
        if level == 0:
            check(name, getframe(1))
        mod = prev_import(name, globals, locals, fromlist, level)
        if level == 0:
            f = getframe(1)
            if _getattr(mod, "__name__", None) != (name if fromlist else name.partition(".")[0]):
                result(mod, f)  # not the module asked for (checked above)
            if fromlist:
                for item in fromlist:
                    sub = _getattr(mod, item, None)
                    if _type(sub) is module_type:
                        result(sub, f)
        return mod

    prev_module = importlib.import_module

    def import_module(name, package=None):
        if not name.startswith("."):
            check(name, getframe(1))
        return result(prev_module(name, package), getframe(1))

    class PolicyFinder:
        """First on sys.meta_path: a module the asker may not import is not
        found (a first load, by any route through the finders)."""

        @staticmethod
        def find_spec(name, path=None, target=None):
            check(name, getframe(1))
            return None

    call_removed, _exec = _bs._call_with_frames_removed, exec
    # The file loaders' own methods: a loader whose type is one of these,
    # with none of them replaced, reads its code from its file.
    loader_methods = {}
    for cls, names in ((_bse.SourceFileLoader, ("get_code", "get_data", "path_stats", "source_to_code", "get_filename")),
                       (_bse.SourcelessFileLoader, ("get_code", "get_data", "get_filename"))):
        loader_methods[cls] = {k: _getattr(cls, k) for k in names}

    def genuine(loader):
        methods = loader_methods.get(_type(loader))
        if methods is None:
            return False
        own = _getattr(loader, "__dict__", {})
        for k, fn in methods.items():
            if k in own or _getattr(_type(loader), k, None) is not fn:
                return False
        return True

    def exec_module(self, module):
        # _LoaderBasics.exec_module (every source and bytecode loader), with
        # the module checked by its name and by its code's file. origin is
        # read by users(): this frame stands for the module it runs, when
        # the loader is the import system's own (a loader of the user's
        # making, or a subclass, may hand over any code).
        # The file read (not the name the code gives itself: a .pyc
        # without its source keeps the one it was made with).
        origin = _getattr(self, "path", None) if genuine(self) else None
        spec = _getattr(module, "__spec__", None)
        name = _getattr(spec, "name", None) or _getattr(module, "__name__", None)
        code = self.get_code(module.__name__)
        if code is None:
            raise ImportError("cannot load module {!r} when get_code() returns None".format(module.__name__))
        check_module(name, code.co_filename, getframe(1))
        call_removed(_exec, code, module.__dict__)

    zipimport = sys.modules.get("zipimport")
    prev_zip_exec = _getattr(_getattr(zipimport, "zipimporter", None), "exec_module", None)

    def zip_exec_module(self, module):
        # zipimporter.exec_module: its archive is where the module's code
        # comes from (origin, read by users()).
        origin = _getattr(self, "archive", None)
        check_module(_getattr(module, "__name__", None), None, getframe(1))
        return prev_zip_exec(self, module)

    orig_imp = {k: _getattr(_imp, k) for k in ("create_builtin", "create_dynamic", "get_frozen_object", "init_frozen",
                                               "_fix_co_filename")}

    def create_builtin(spec):
        origin = "built-in"
        check_module(_getattr(spec, "name", None), None, getframe(1))
        return orig_imp["create_builtin"](spec)

    def create_dynamic(spec, file=None):
        origin = _getattr(spec, "origin", None)
        check_module(_getattr(spec, "name", None), origin, getframe(1))
        return orig_imp["create_dynamic"](spec) if file is None else orig_imp["create_dynamic"](spec, file)

    def get_frozen_object(name, data=None):
        origin = "frozen"
        check_module(name, None, getframe(1))
        code = orig_imp["get_frozen_object"](name) if data is None else orig_imp["get_frozen_object"](name, data)
        if _type(code) is code_type and data is None:
            code_tree(code, frozen)  # a frozen module loaded now: the library's own code
        return code

    def init_frozen(name):
        origin = "frozen"
        check_module(name, None, getframe(1))
        return orig_imp["init_frozen"](name)

    def fix_co_filename(code, path):
        if _isinstance(path, _str) and path.startswith(lib) and users(getframe(1)):
            violation("module_blocked", "code as " + path)
            raise Blocked("Giving code a library file's name is blocked by security policy")
        return orig_imp["_fix_co_filename"](code, path)

    def claims(code):
        """Whether code, or code nested in it, claims a library file or the
        driver as its origin."""
        stack = [code]
        while stack:
            c = stack.pop()
            if _id(c) in driver or c.co_filename.startswith(lib):
                return True
            stack.extend(k for k in c.co_consts if _type(k) is code_type)
        return False

    introspection = frozenset(("gc.get_objects", "gc.get_referrers", "gc.get_referents", "sys._current_frames",
                               "sys.settrace", "sys.setprofile", "code.__new__", "function.__new__",
                               "marshal.loads", "marshal.load"))
    run_msg = "Running a library's code outside the import system is blocked by security policy"

    def audit(event, args):
        if event == "exec" or event == "function.__new__":
            # Running a library's (or the driver's) code is the import
            # system's job; not the user's, with code a loader's get_code
            # or marshal gave.
            if args and _type(args[0]) is code_type and claims(args[0]) and users(getframe(1)):
                violation("module_blocked", "run " + args[0].co_filename)
                raise Blocked(run_msg)
        elif event == "object.__setattr__":
            if len(args) > 2 and args[1] == "__code__" and _type(args[2]) is code_type and claims(args[2]) \
                    and users(getframe(1)):
                violation("module_blocked", "run " + args[2].co_filename)
                raise Blocked(run_msg)
        elif event == "compile" or event == "code.__new__":
            # Code compiled or made under a library file's name would pass
            # for the library's: only the import system itself may.
            if len(args) > 1 and _isinstance(args[1], _str) and args[1].startswith(lib) and users(getframe(1)):
                violation("module_blocked", "compile as " + args[1])
                raise Blocked("Compiling code as a library file is blocked by security policy")
        if system[0] and event in introspection:
            if event.startswith("gc.") or users(getframe(1)):
                violation("module_blocked", event)
                raise Blocked("%s is blocked by security policy (allow_import_system is false)" % event)

    for w in (guarded_import, import_module, PolicyFinder.find_spec, fix_co_filename, audit, claims, check,
              check_module, result, users, names_it, is_helper, refuse, denied, covered, path_name, genuine, kind):
        relays[_id(w.__code__)] = None
    for w in (exec_module, zip_exec_module, create_builtin, create_dynamic, get_frozen_object, init_frozen):
        relays[_id(w.__code__)] = "loader"

    def add(allow, block, deny_system):
        rules.append((allow, block))
        if deny_system:
            system[0] = True

    sys.addaudithook(audit)
    builtins.__import__ = guarded_import
    importlib.import_module = import_module
    importlib.__import__ = guarded_import
    sys.meta_path.insert(0, PolicyFinder())
    _bse._LoaderBasics.exec_module = exec_module
    if prev_zip_exec is not None:
        zipimport.zipimporter.exec_module = zip_exec_module
    _imp.create_builtin, _imp.create_dynamic = create_builtin, create_dynamic
    _imp.get_frozen_object, _imp.init_frozen, _imp._fix_co_filename = get_frozen_object, init_frozen, fix_co_filename
    return add


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
        if policy_error is None and not _paths_done[0]:
            try:
                _user_paths()
            except BaseException:
                pass
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
