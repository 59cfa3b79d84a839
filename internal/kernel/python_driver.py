# Sheepfold Python kernel driver: requests arrive as JSON lines on fd 3,
# messages leave as JSON lines on fd 4; stdout and stderr are the real fds.
# Only what every execution needs is imported here: each import is on the
# path of a new context's first execution (subprocess and re load when a
# cell uses a shell escape, traceback when one raises).
import ast, binascii, builtins, io, json, linecache, os, signal, sys


def _b64(data):
    return binascii.b2a_base64(data, newline=False).decode()

_ctl_in = os.fdopen(3, "r", encoding="utf-8")
_ctl_out = os.fdopen(4, "w", encoding="utf-8")
_MAX_RESULT = 3_500_000
_globals = {"__name__": "__main__", "__builtins__": builtins}
# The chart describer's source (python_charts.py) arrives as argv[1]; it is
# compiled the first time a figure is rendered.
_charts_src = sys.argv.pop(1) if len(sys.argv) > 1 else ""
_charts = None
signal.signal(signal.SIGINT, signal.default_int_handler)
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
    if main:
        r["is_main_result"] = True
    _emit_result(r)


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
            exec(compile(_charts_src, "<sheepfold-charts>", "exec"), _charts)
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


class _PyplotHook:
    """Makes plt.show() emit the figures, as a notebook's inline backend
    does, by wrapping matplotlib.pyplot when it is first imported."""

    def find_spec(self, name, path=None, target=None):
        if name != "matplotlib.pyplot":
            return None
        import importlib.machinery
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def patched(module):
            exec_module(module)
            module.show = _figures
        spec.loader.exec_module = patched
        return spec


sys.meta_path.insert(0, _PyplotHook())
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


def _error(e):
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


def _run(code, n):
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


def main():
    n = 0
    for line in _ctl_in:
        req = json.loads(line)
        preload = req.get("preload")
        if preload is None:
            n += 1
        env = req.get("env") or {}
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            try:
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
        finally:
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
