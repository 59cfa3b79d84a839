"""Functions that run remotely, on batches (the shape Modal users know).

    import sheepfold

    @sheepfold.function(memory_mb=512, timeout=60)
    def score(doc):
        return len(doc.split())

    score.remote("a b c")                  # 3, run in a sandbox
    list(score.map(["a", "b c", "d e f"]))  # [1, 2, 3], in input order
    score("a b")                           # 2, run here: still a plain function

What is shipped is the function's own source (inspect.getsource,
dedented, its decorators stripped) and, for each module-level name it
uses: an import for a module or for a function or class of another module,
or the value for a literal (numbers, strings, tuples, lists, dicts of
them). A lambda, a function that closes over variables of an enclosing
function, or one that uses another module-level name of its own module
(a helper function, an object) cannot be shipped: the decorator raises
ValueError saying which names, before anything is sent.

Arguments and return values travel as JSON. An exception raised remotely
is raised here as a RemoteError that also derives from the remote
exception's class when that is a built-in one (so ``except ValueError``
catches a remote ValueError), with the remote traceback in its message
and in ``.traceback``.

Each call of .remote or .map is one batch (/v1/batches): the function's
code is checked in a sandbox first (a syntax error raises
InvalidHandlerError before any input runs), then every input runs in
a sandbox of the account, under its limits, charged to it.
"""

from __future__ import annotations

import ast
import builtins
import inspect
import json
import textwrap
import types
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional

from ._http import HTTPClient
from .batches import Batch, BatchItemError, Batches
from .errors import CodeExecutionError, SheepfoldError
from .models import Resources

__all__ = ["Function", "RemoteError", "function"]


class RemoteError(CodeExecutionError):
    """An exception the function raised remotely (or the run's failure:
    a timeout, out of memory), carried back: .name is its class's name,
    .value its message, .traceback the remote traceback, .code the run's
    ERR_* code when the run itself failed (ERR_CODE_EXCEPTION when the
    function raised)."""

    def __init__(self, name: str, value: str, traceback: str = "", code: str = "") -> None:
        msg = f"{name}: {value}"
        if traceback:
            msg += "\n\nRemote traceback:\n" + traceback.rstrip()
        super().__init__(msg, code=code or None, name=name, traceback=traceback)
        self.value = value

    def __str__(self) -> str:
        return self.message


_remote_classes: Dict[str, type] = {}


def _remote_error(e: BatchItemError) -> RemoteError:
    """A RemoteError for e, of a class that also derives from the built-in
    exception of e's name when there is one."""
    base = getattr(builtins, e.name, None)
    cls: type = RemoteError
    if isinstance(base, type) and issubclass(base, Exception) and not issubclass(base, RemoteError):
        cls = _remote_classes.get(e.name)
        if cls is None:
            try:
                cls = type(e.name, (RemoteError, base), {"__module__": __name__})
            except TypeError:  # an incompatible layout: the plain class
                cls = RemoteError
            _remote_classes[e.name] = cls
    err = cls.__new__(cls)
    RemoteError.__init__(err, e.name, e.value, e.traceback, e.code)
    return err


def _is_literal(v: Any) -> bool:
    try:
        return ast.literal_eval(repr(v)) == v
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return False


def _global_names(code: types.CodeType) -> List[str]:
    """The names code (and the functions and comprehensions nested in it)
    loads as globals or attributes, in order, once each."""
    seen: Dict[str, None] = {}
    stack = [code]
    while stack:
        c = stack.pop()
        for n in c.co_names:
            seen.setdefault(n, None)
        stack.extend(k for k in c.co_consts if isinstance(k, types.CodeType))
    return list(seen)


def source_of(fn: Callable[..., Any]) -> str:
    """The Python that defines fn remotely: the imports and literals of
    the module-level names it uses, then its source without decorators.
    ValueError when fn cannot be shipped."""
    if not isinstance(fn, types.FunctionType):
        raise ValueError(f"sheepfold.function takes a plain function, not {type(fn).__name__}")
    if fn.__name__ == "<lambda>":
        raise ValueError("a lambda cannot be shipped: sheepfold.function needs a function defined with def")
    if fn.__code__.co_freevars:
        raise ValueError(f"{fn.__qualname__} closes over {', '.join(fn.__code__.co_freevars)} of an enclosing function: "
                         "it cannot be shipped; pass them as arguments or define them at module level")
    try:
        src = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError) as e:
        raise ValueError(f"the source of {fn.__qualname__} cannot be read ({e}): define it in a file") from e
    tree = ast.parse(src)
    defs = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == fn.__name__]
    if not defs:
        raise ValueError(f"the source of {fn.__qualname__} is not a def of it")
    node = defs[0]
    if isinstance(node, ast.AsyncFunctionDef):
        raise ValueError(f"{fn.__qualname__} is async: sheepfold.function takes a plain def")
    lines = src.splitlines()
    body = "\n".join(lines[node.lineno - 1:node.end_lineno]) + "\n"  # from the def: the decorators dropped
    head: List[str] = []
    missing: List[str] = []
    for name in _global_names(fn.__code__):
        if name == fn.__name__ or name not in fn.__globals__:
            continue  # itself (recursion), a builtin or an attribute
        v = fn.__globals__[name]
        if isinstance(v, types.ModuleType):
            head.append(f"import {v.__name__} as {name}" if v.__name__ != name else f"import {name}")
        elif (isinstance(v, (types.FunctionType, type, types.BuiltinFunctionType)) and getattr(v, "__module__", None)
              and v.__module__ not in ("__main__", fn.__module__) and "<locals>" not in v.__qualname__
              and "." not in v.__qualname__):
            head.append(f"from {v.__module__} import {v.__qualname__} as {name}")
        elif isinstance(v, Function):
            missing.append(name + " (another sheepfold.function: call it with .remote from here)")
        elif _is_literal(v):
            head.append(f"{name} = {v!r}")
        else:
            missing.append(name)
    if missing:
        raise ValueError(f"{fn.__qualname__} uses module-level names that cannot be shipped: {', '.join(missing)}; "
                         "import or define them inside the function")
    return "\n".join(head) + ("\n\n" if head else "") + body


# The handler every function's batch runs: its inputs are {"a": args,
# "k": kwargs}.
_HANDLER = """

_sf_fn = {name}


def handler(_sf_call):
    return _sf_fn(*_sf_call["a"], **_sf_call["k"])
"""


def _gpu(gpu: Any) -> "tuple[int, List[str]]":
    """gpu= as resources' gpu and devices."""
    if gpu is None or gpu is False or gpu == 0:
        return 0, []
    if isinstance(gpu, bool):
        return 1, []
    if isinstance(gpu, int) and gpu > 0:
        return gpu, []
    if isinstance(gpu, str) and "/" in gpu and "=" in gpu:
        return 0, [gpu]
    raise ValueError(f"gpu={gpu!r}: give a number of GPUs (gpu=1) or a device's CDI name (gpu='nvidia.com/gpu=0'); "
                     "the server names its devices by its CDI specs, not by model")


class Function:
    """A function that runs remotely: .remote(*args, **kwargs) for one
    call, .map(items) for one call per item (in order). Calling it runs
    it here."""

    def __init__(self, fn: Callable[..., Any], *, template: Optional[str] = None, memory_mb: Optional[int] = None,
                 cpus: Optional[float] = None, timeout: Optional[float] = None, gpu: Optional[Any] = None,
                 concurrency: int = 8, retries: int = 0, reuse: str = "worker", poll: float = 0.2,
                 api_key: Optional[str] = None, base_url: Optional[str] = None,
                 http: Optional[HTTPClient] = None) -> None:
        gpus, devices = _gpu(gpu)
        self._fn = fn
        self.code = source_of(fn) + _HANDLER.format(name=fn.__name__)
        self.template, self.timeout, self.concurrency, self.retries, self.reuse, self.poll = (
            template, timeout, concurrency, retries, reuse, poll)
        self.resources = (Resources(cpus=cpus or 0, memory_mb=memory_mb or 0, gpu=gpus, devices=devices)
                          if (cpus or memory_mb or gpus or devices) else None)
        self._api_key, self._base_url, self._http = api_key, base_url, http
        self.last_batch: Optional[Batch] = None
        self.__name__ = fn.__name__
        self.__qualname__ = fn.__qualname__
        self.__doc__ = fn.__doc__
        self.__wrapped__ = fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._fn(*args, **kwargs)

    def _batches(self) -> Batches:
        return Batches(api_key=self._api_key, base_url=self._base_url, http=self._http)

    def _run(self, calls: List[Dict[str, Any]], return_exceptions: bool) -> Iterator[Any]:
        b = self._batches()
        made = b.create(self.code, calls, concurrency=max(1, min(self.concurrency, len(calls))), retries=self.retries,
                        timeout_ms=int(self.timeout * 1000) if self.timeout else None, template=self.template,
                        resources=self.resources, reuse=self.reuse or None)
        done = b.wait(made.id, poll=self.poll)
        self.last_batch = done
        if done.status != "done":
            why = f": {done.error.code}: {done.error.message}" if done.error else ""
            raise SheepfoldError(f"batch {done.id} {done.status}{why}", code=done.error.code if done.error else None)
        for r in b.results(done.id):
            if r.status == "done":
                yield r.result
                continue
            err = _remote_error(r.error or BatchItemError(name="Error", value="the item failed"))
            if return_exceptions:
                yield err
            else:
                raise err

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        """Run one call in a sandbox and return its value; raise what it
        raised (a RemoteError)."""
        return next(self._run([{"a": list(args), "k": kwargs}], False))

    def map(self, items: Iterable[Any], *, return_exceptions: bool = False) -> Iterator[Any]:
        """Run one call per item (concurrency at a time) and yield the
        values in the items' order. An item that raised raises its
        RemoteError when reached, or is yielded as one with
        return_exceptions=True."""
        calls = [{"a": [x], "k": {}} for x in items]
        if not calls:
            return iter(())
        return self._run(calls, return_exceptions)


def function(_fn: Optional[Callable[..., Any]] = None, *, template: Optional[str] = None,
             memory_mb: Optional[int] = None, cpus: Optional[float] = None, timeout: Optional[float] = None,
             gpu: Optional[Any] = None, concurrency: int = 8, retries: int = 0, reuse: str = "worker",
             api_key: Optional[str] = None, base_url: Optional[str] = None) -> Any:
    """Decorate a function to run it remotely (see the module's doc):
    template, memory_mb and cpus of its sandboxes, timeout in seconds of
    each call, concurrency of .map, retries of a call that raised, and
    reuse ("worker": each of the concurrency workers keeps its sandbox,
    so imports are paid once per worker; "" for a fresh sandbox per
    call). gpu is a number of GPUs (the server's GPU class) or a device's
    CDI name ("nvidia.com/gpu=0"); a GPU model's name ("T4") is refused:
    the server's devices are named by its CDI specs."""
    def deco(fn: Callable[..., Any]) -> Function:
        return Function(fn, template=template, memory_mb=memory_mb, cpus=cpus, timeout=timeout, gpu=gpu,
                        concurrency=concurrency, retries=retries, reuse=reuse, api_key=api_key, base_url=base_url)
    if _fn is not None:
        return deco(_fn)
    return deco
