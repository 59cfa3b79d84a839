"""Data classes for the objects of the Sheepfold API."""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Dict, Iterator, List, Mapping, Optional

__all__ = [
    "Resources",
    "SandboxInfo",
    "SnapshotInfo",
    "Diff",
    "Adopted",
    "Result",
    "ExecutionError",
    "Logs",
    "Execution",
    "CodeContext",
    "CommandResult",
    "ProcessInfo",
    "FileInfo",
    "EntryInfo",
    "parse_time",
]


def parse_time(value: Any) -> Optional[datetime]:
    """Parse an RFC 3339 time ("2026-01-02T03:04:05.123456789Z"); None if absent/bad."""
    if not value or not isinstance(value, str):
        return None
    s = value.strip()
    if s.endswith(("Z", "z")):
        s = s[:-1] + "+00:00"
    # fromisoformat takes exactly 6 fractional digits before 3.11 (at most 6
    # after); Go sends 0 to 9.
    t_pos = max(s.find("T"), s.find("t"), s.find(" "))
    dot = s.find(".", t_pos if t_pos >= 0 else 0)
    if dot >= 0:
        end = dot + 1
        while end < len(s) and s[end].isdigit():
            end += 1
        frac = s[dot + 1:end][:6].ljust(6, "0")
        s = s[:dot] + ("." + frac if frac else "") + s[end:]
    try:
        return datetime.fromisoformat(s)
    except ValueError:
        return None


def _d(data: Any) -> Mapping[str, Any]:
    return data if isinstance(data, Mapping) else {}


@dataclass
class Resources:
    cpus: float = 0
    memory_mb: int = 0
    disk_mb: int = 0
    pids: int = 0
    # A number of GPUs to ask for; devices by CDI name (in an answer, every
    # device the sandbox holds).
    gpu: int = 0
    devices: List[str] = field(default_factory=list)

    @classmethod
    def from_dict(cls, data: Any) -> "Resources":
        d = _d(data)
        return cls(cpus=d.get("cpus", 0) or 0, memory_mb=d.get("memory_mb", 0) or 0,
                   disk_mb=d.get("disk_mb", 0) or 0, pids=d.get("pids", 0) or 0,
                   gpu=d.get("gpu", 0) or 0, devices=list(d.get("devices") or []))

    def to_dict(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {"cpus": self.cpus, "memory_mb": self.memory_mb, "disk_mb": self.disk_mb, "pids": self.pids}
        if self.gpu:
            out["gpu"] = self.gpu
        if self.devices:
            out["devices"] = list(self.devices)
        return out


@dataclass
class SnapshotInfo:
    """A snapshot: a saved sandbox (processes, memory, files) that new
    sandboxes start from (Sandbox.create(snapshot=name))."""

    name: str
    sandbox_id: str = ""
    template: str = ""
    resources: Resources = field(default_factory=Resources)
    created_at: Optional[datetime] = None
    size_bytes: int = 0

    @classmethod
    def from_dict(cls, data: Any) -> "SnapshotInfo":
        d = _d(data)
        return cls(
            name=d.get("name", "") or "",
            sandbox_id=d.get("sandbox_id", "") or "",
            template=d.get("template", "") or "",
            resources=Resources.from_dict(d.get("resources")),
            created_at=parse_time(d.get("created_at")),
            size_bytes=int(d.get("size_bytes") or 0),
        )


@dataclass
class SnapshotPool:
    """A snapshot's pool: sandboxes restored from it ahead of need, which
    creates from it take (Sandbox.set_snapshot_pool)."""

    snapshot: str
    size: int = 0
    ready: int = 0

    @classmethod
    def from_dict(cls, data: Any) -> "SnapshotPool":
        d = _d(data)
        return cls(snapshot=d.get("snapshot", "") or "", size=int(d.get("size") or 0), ready=int(d.get("ready") or 0))


@dataclass
class Diff:
    """What a fork added, changed and deleted in its files since it was
    forked from ``against`` (paths inside the sandbox, sorted)."""

    against: str
    added: List[str] = field(default_factory=list)
    changed: List[str] = field(default_factory=list)
    deleted: List[str] = field(default_factory=list)

    @classmethod
    def from_dict(cls, data: Any) -> "Diff":
        d = _d(data)
        return cls(
            against=d.get("against", "") or "",
            added=list(d.get("added") or []),
            changed=list(d.get("changed") or []),
            deleted=list(d.get("deleted") or []),
        )


@dataclass
class Adopted:
    """What adopt() copied into the parent, deleted from it, and left:
    ``skipped`` holds {"path", "reason"} objects, the server's."""

    parent: str
    copied: List[str] = field(default_factory=list)
    deleted: List[str] = field(default_factory=list)
    skipped: List[Dict[str, str]] = field(default_factory=list)

    @classmethod
    def from_dict(cls, data: Any) -> "Adopted":
        d = _d(data)
        return cls(
            parent=d.get("parent", "") or "",
            copied=list(d.get("copied") or []),
            deleted=list(d.get("deleted") or []),
            skipped=[dict(s) for s in d.get("skipped") or []],
        )


@dataclass
class SandboxInfo:
    """A sandbox as the server describes it."""

    sandbox_id: str
    template: str = ""
    state: str = ""
    created_at: Optional[datetime] = None
    expires_at: Optional[datetime] = None
    resources: Resources = field(default_factory=Resources)
    metadata: Dict[str, str] = field(default_factory=dict)
    stop_reason: Optional[str] = None
    # With usage=True: cpu_seconds and memory_bytes on a listing, every
    # figure for one sandbox (the server's names); None otherwise.
    usage: Optional[Dict[str, Any]] = None
    # Whether it pauses instead of stopping at its end (auto_pause).
    auto_pause: bool = False
    # The volumes a live sandbox mounted at create (VolumeMount).
    volume_mounts: List[Any] = field(default_factory=list)
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def id(self) -> str:
        return self.sandbox_id

    @property
    def end_at(self) -> Optional[datetime]:
        """E2B's name for expires_at."""
        return self.expires_at

    @classmethod
    def from_dict(cls, data: Any) -> "SandboxInfo":
        d = _d(data)
        return cls(
            sandbox_id=d.get("id", ""),
            template=d.get("template", "") or "",
            state=d.get("state", "") or "",
            created_at=parse_time(d.get("created_at")),
            expires_at=parse_time(d.get("expires_at")),
            resources=Resources.from_dict(d.get("resources")),
            metadata=dict(d.get("metadata") or {}),
            stop_reason=d.get("stop_reason") or None,
            usage=dict(d["usage"]) if isinstance(d.get("usage"), Mapping) else None,
            auto_pause=bool(d.get("auto_pause")),
            volume_mounts=_volume_mounts(d.get("volume_mounts")),
            raw=dict(d),
        )


_FORMATS = ("text", "html", "markdown", "svg", "png", "jpeg", "pdf", "latex", "json", "javascript")


@dataclass
class Result:
    """One rich output of executed code (the value of the last expression, a
    figure, a display() call), as MIME renderings. Binary formats (png,
    jpeg, pdf) are base64 strings, as in E2B; see :meth:`png_bytes`."""

    text: Optional[str] = None
    html: Optional[str] = None
    markdown: Optional[str] = None
    svg: Optional[str] = None
    png: Optional[str] = None
    jpeg: Optional[str] = None
    pdf: Optional[str] = None
    latex: Optional[str] = None
    json: Optional[Any] = None
    javascript: Optional[str] = None
    extra: Optional[Dict[str, Any]] = None
    is_main_result: bool = False
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_dict(cls, data: Any) -> "Result":
        d = _d(data)
        kw = {k: d.get(k) for k in _FORMATS}
        return cls(**kw, extra=d.get("extra") or None, is_main_result=bool(d.get("is_main_result")),
                   raw=dict(d))

    def formats(self) -> List[str]:
        """The formats this result has, e.g. ["text", "png"] (plus extra MIME types)."""
        out = [k for k in _FORMATS if getattr(self, k) is not None]
        if self.extra:
            out.extend(self.extra.keys())
        return out

    def __iter__(self) -> Iterator[str]:
        return iter(self.formats())

    def __getitem__(self, key: str) -> Any:
        if key in _FORMATS:
            return getattr(self, key)
        if self.extra and key in self.extra:
            return self.extra[key]
        raise KeyError(key)

    def _decode(self, value: Optional[str]) -> Optional[bytes]:
        return base64.b64decode(value) if value else None

    def png_bytes(self) -> Optional[bytes]:
        return self._decode(self.png)

    def jpeg_bytes(self) -> Optional[bytes]:
        return self._decode(self.jpeg)

    def pdf_bytes(self) -> Optional[bytes]:
        return self._decode(self.pdf)

    def __str__(self) -> str:
        return self.text if self.text is not None else repr(self)

    # Jupyter display hooks, so a Result renders in a notebook.
    def _repr_html_(self) -> Optional[str]:
        return self.html

    def _repr_markdown_(self) -> Optional[str]:
        return self.markdown

    def _repr_svg_(self) -> Optional[str]:
        return self.svg

    def _repr_png_(self) -> Optional[str]:
        return self.png

    def _repr_jpeg_(self) -> Optional[str]:
        return self.jpeg

    def _repr_latex_(self) -> Optional[str]:
        return self.latex

    def _repr_json_(self) -> Optional[Any]:
        return self.json


@dataclass
class ExecutionError:
    """An exception raised by the executed code (not an SDK exception)."""

    name: str = ""
    value: str = ""
    traceback: str = ""

    @classmethod
    def from_dict(cls, data: Any) -> "ExecutionError":
        d = _d(data)
        return cls(name=d.get("name", "") or "", value=d.get("value", "") or "",
                   traceback=d.get("traceback", "") or "")

    def __str__(self) -> str:
        return f"{self.name}: {self.value}"


@dataclass
class Logs:
    """stdout and stderr as lists of chunks (one per streamed event; one
    chunk in all when the response was not streamed)."""

    stdout: List[str] = field(default_factory=list)
    stderr: List[str] = field(default_factory=list)


@dataclass
class Execution:
    """The outcome of :meth:`Sandbox.run_code`."""

    results: List[Result] = field(default_factory=list)
    logs: Logs = field(default_factory=Logs)
    error: Optional[ExecutionError] = None
    status: str = ""
    error_code: Optional[str] = None
    truncated: bool = False
    execution_time_ms: float = 0.0
    cpu_time_ms: float = 0.0
    peak_memory_bytes: int = 0
    # Results produced but not delivered ({"results", "bytes", "reason"}):
    # past a result's or the execution's bounds; None when none were.
    dropped: Optional[Dict[str, Any]] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def text(self) -> Optional[str]:
        """The text of the main result (the value of the last expression), or None."""
        for r in self.results:
            if r.is_main_result:
                return r.text
        return None

    @property
    def stdout(self) -> str:
        return "".join(self.logs.stdout)

    @property
    def stderr(self) -> str:
        return "".join(self.logs.stderr)

    @classmethod
    def from_dict(cls, data: Any) -> "Execution":
        d = _d(data)
        logs = Logs(stdout=[d["stdout"]] if d.get("stdout") else [],
                    stderr=[d["stderr"]] if d.get("stderr") else [])
        err = d.get("error")
        return cls(
            results=[Result.from_dict(r) for r in (d.get("results") or [])],
            logs=logs,
            error=ExecutionError.from_dict(err) if isinstance(err, Mapping) else None,
            status=d.get("status", "") or "",
            error_code=d.get("error_code") or None,
            truncated=bool(d.get("truncated")),
            execution_time_ms=d.get("execution_time_ms", 0) or 0,
            cpu_time_ms=d.get("cpu_time_ms", 0) or 0,
            peak_memory_bytes=d.get("peak_memory_bytes", 0) or 0,
            dropped=dict(d["dropped"]) if isinstance(d.get("dropped"), Mapping) else None,
            raw=dict(d),
        )


@dataclass
class CodeContext:
    """A code context: an interpreter whose state (variables, imports, cwd)
    persists across executions."""

    id: str
    language: str = ""
    cwd: str = ""

    @classmethod
    def from_dict(cls, data: Any) -> "CodeContext":
        d = _d(data)
        return cls(id=d.get("id", ""), language=d.get("language", "") or "", cwd=d.get("cwd", "") or "")


@dataclass
class CommandResult:
    """How a command ended. A non-zero exit code does not raise."""

    pid: int = 0
    exit_code: int = 0
    signal: int = 0
    status: str = ""
    stdout: str = ""
    stderr: str = ""
    truncated: bool = False
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def error(self) -> Optional[str]:
        """E2B compatibility: stderr when the command failed, else None."""
        return self.stderr if self.exit_code != 0 or self.signal else None

    @classmethod
    def from_dict(cls, data: Any, stdout: Optional[str] = None, stderr: Optional[str] = None) -> "CommandResult":
        d = _d(data)
        return cls(
            pid=d.get("pid", 0) or 0,
            exit_code=d.get("exit_code", 0) or 0,
            signal=d.get("signal", 0) or 0,
            status=d.get("status", "") or "",
            # A streamed done event carries no output: use the streamed chunks.
            stdout=d.get("stdout") or stdout or "",
            stderr=d.get("stderr") or stderr or "",
            truncated=bool(d.get("truncated")),
            raw=dict(d),
        )


@dataclass
class ProcessInfo:
    """A running process started through the commands API."""

    pid: int
    cmd: str = ""
    args: List[str] = field(default_factory=list)
    cwd: str = ""
    tag: Optional[str] = None
    started: Optional[datetime] = None

    @classmethod
    def from_dict(cls, data: Any) -> "ProcessInfo":
        d = _d(data)
        return cls(pid=d.get("pid", 0) or 0, cmd=d.get("cmd", "") or "", args=list(d.get("args") or []),
                   cwd=d.get("cwd", "") or "", tag=d.get("tag") or None, started=parse_time(d.get("started")))


@dataclass
class FileInfo:
    """A path in the sandbox. ``type`` is "file", "dir", "symlink" or "other"."""

    name: str
    path: str
    type: str = "file"
    size: int = 0
    mode: int = 0
    mod_time: Optional[datetime] = None
    owner: str = ""
    group: str = ""
    symlink_target: Optional[str] = None

    @property
    def is_dir(self) -> bool:
        return self.type == "dir"

    @property
    def is_file(self) -> bool:
        return self.type == "file"

    @classmethod
    def from_dict(cls, data: Any) -> "FileInfo":
        d = _d(data)
        return cls(name=d.get("name", "") or "", path=d.get("path", "") or "", type=d.get("type", "") or "",
                   size=d.get("size", 0) or 0, mode=d.get("mode", 0) or 0,
                   mod_time=parse_time(d.get("mod_time")), owner=d.get("owner", "") or "",
                   group=d.get("group", "") or "", symlink_target=d.get("symlink_target") or None)


# E2B's name for a directory entry.
EntryInfo = FileInfo


@dataclass
class PolicyAnswer:
    """A sandbox's security policy as the server reports it (get_policy,
    set_policy): ``policy`` is the policy's JSON object ({} when none was
    given). ``restart_required`` says the last change loosened a rule a
    running interpreter cannot drop (named in ``loosened``): each code
    context restarts, losing its state, before its next execution."""

    policy: Dict[str, Any]
    restart_required: bool = False
    loosened: List[str] = field(default_factory=list)

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "PolicyAnswer":
        return cls(policy=d.get("policy") or {}, restart_required=bool(d.get("restart_required")),
                   loosened=list(d.get("loosened") or []))


def _volume_mounts(items: Any) -> List[Any]:
    from .volumes import VolumeMount  # volumes imports this module

    return [VolumeMount(name=m.get("name", ""), path=m.get("path", ""), read_only=bool(m.get("read_only")),
                        shared=bool(m.get("shared"))) for m in items or [] if isinstance(m, Mapping)]
