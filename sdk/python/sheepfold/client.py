"""The session client: a model bound to a sandbox, in the shape the seeds' users write.

    from sheepfold import Client

    client = Client(api_key=os.environ["SHEEPFOLD_API_KEY"], base_url="http://127.0.0.1:8080/v1")
    session = client.sessions.create(model="deepseek-chat", sandbox_config={"allowed_modules": ["pandas"]})
    r = client.sandbox.execute(session_id=session.id, code="print(1)", language="python", timeout_ms=30000)
    r.output, r.status, r.execution_time_ms, r.error
    answer = client.sessions.ask(session_id=session.id, prompt="Total revenue per country in orders.csv",
                                 files={"orders.csv": open("orders.csv").read()})
    print(answer.text, answer.tokens.total_tokens, answer.cost)

An execution's failure (timeout, blocked module, restricted network, an
exception of the code) is in ``r.status`` and ``r.error``, a typed
exception (``SandboxTimeoutError``, ``ModuleBlockedError``,
``NetworkRestrictedError``, ``CodeExecutionError``...) carrying ``code`` and
``message``; ``r.raise_for_error()`` raises it. Request errors (a bad key,
an exhausted quota, a provider failure) raise at once.
"""

from __future__ import annotations

import base64
import os
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Union

from ._http import HTTPClient, path_segment, raise_failure
from .accounts import Alert, Credits
from .errors import CodeExecutionError, SheepfoldError, error_for
from .events import Event, Events
from .models import Resources, parse_time

__all__ = ["Client", "Session", "SessionExecution", "Answer", "Tokens", "Step", "Usage", "Monitor"]


@dataclass
class Session:
    id: str
    model: str
    sandbox_id: str
    template: str
    state: str
    created_at: Optional[datetime]
    expires_at: Optional[datetime]
    stop_reason: Optional[str] = None
    resources: Resources = field(default_factory=Resources)
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "Session":
        return cls(id=d["id"], model=d.get("model", ""), sandbox_id=d.get("sandbox_id", d["id"]),
                   template=d.get("template", ""), state=d.get("state", ""),
                   created_at=parse_time(d.get("created_at")), expires_at=parse_time(d.get("expires_at")),
                   stop_reason=d.get("stop_reason"), resources=Resources.from_dict(d.get("resources")), raw=d)


def _exec_error(e: Optional[Mapping[str, Any]]) -> Optional[SheepfoldError]:
    if not e:
        return None
    msg = e.get("message") or ""
    if e.get("code"):
        return error_for(e["code"], msg)
    return CodeExecutionError(msg, name=e.get("name") or "", traceback=e.get("traceback") or "")


@dataclass
class SessionExecution:
    """One execution: the seeds' shape, with charts (base64 images)."""

    output: str
    status: str  # success, error or timeout
    execution_time_ms: float
    error: Optional[SheepfoldError]
    charts: List[Dict[str, str]] = field(default_factory=list)  # {"format": "png", "data": base64}
    results: List[str] = field(default_factory=list)
    code: Optional[str] = None
    language: Optional[str] = None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "SessionExecution":
        return cls(output=d.get("output", ""), status=d.get("status", ""),
                   execution_time_ms=float(d.get("execution_time_ms") or 0), error=_exec_error(d.get("error")),
                   charts=list(d.get("charts") or []), results=list(d.get("results") or []),
                   code=d.get("code"), language=d.get("language"))

    def chart_bytes(self) -> List[bytes]:
        """The charts' images, decoded (SVG charts as their text)."""
        return [c["data"].encode() if c.get("format") == "svg" else base64.b64decode(c["data"]) for c in self.charts]

    def raise_for_error(self) -> "SessionExecution":
        """Raise the execution's error, if any; return self otherwise."""
        if self.error is not None:
            raise self.error
        return self


@dataclass
class Tokens:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


@dataclass
class Answer:
    """What an ask ends with."""

    text: str
    stop_reason: str  # answered, max_steps or time_limit
    steps: int
    executions: List[SessionExecution]
    tokens: Tokens
    time_ms: float
    model_time_ms: float
    sheepfold_time_ms: float
    cost: str
    cost_micros: int
    model: str
    session_id: str

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Answer":
        t = d.get("tokens") or {}
        return cls(text=d.get("text", ""), stop_reason=d.get("stop_reason", ""), steps=int(d.get("steps") or 0),
                   executions=[SessionExecution.from_dict(e) for e in d.get("executions") or []],
                   tokens=Tokens(int(t.get("prompt_tokens") or 0), int(t.get("completion_tokens") or 0),
                                 int(t.get("total_tokens") or 0)),
                   time_ms=float(d.get("time_ms") or 0), model_time_ms=float(d.get("model_time_ms") or 0),
                   sheepfold_time_ms=float(d.get("sheepfold_time_ms") or 0), cost=d.get("cost", "0.000000"),
                   cost_micros=int(d.get("cost_micros") or 0), model=d.get("model", ""),
                   session_id=d.get("session_id", ""))


@dataclass
class Step:
    """One streamed step of an ask: a model reply or an execution."""

    type: str  # "model" or "execution"
    step: int
    content: str = ""
    tool_calls: List[Dict[str, Any]] = field(default_factory=list)
    execution: Optional[SessionExecution] = None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Step":
        ex = d.get("execution")
        return cls(type=d.get("type", ""), step=int(d.get("step") or 0), content=d.get("content") or "",
                   tool_calls=list(d.get("tool_calls") or []),
                   execution=SessionExecution.from_dict(ex) if ex else None)


@dataclass
class Usage:
    """The account's usage this month (or in the period asked for)."""

    tokens_used: int
    tokens_limit: Optional[int]  # the configured models' monthly quotas summed; None: unlimited
    models: List[Dict[str, Any]]  # per model: tokens, requests, monthly_limit, cost
    total: Dict[str, Any]  # sandbox usage: cpu_seconds, executions, cost...
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "Usage":
        return cls(tokens_used=int(d.get("tokens_used") or 0), tokens_limit=d.get("tokens_limit"),
                   models=list(d.get("models") or []), total=dict(d.get("total") or {}), raw=d)


def _files(files: Union[Mapping[str, Union[str, bytes]], Sequence[Mapping[str, Any]], None]) -> Optional[List[Dict[str, Any]]]:
    if not files:
        return None
    if isinstance(files, Mapping):
        out = []
        for path, content in files.items():
            if isinstance(content, bytes):
                out.append({"path": path, "content": base64.b64encode(content).decode(), "encoding": "base64"})
            else:
                out.append({"path": path, "content": content})
        return out
    return [dict(f) for f in files]


class Sessions:
    def __init__(self, http: HTTPClient) -> None:
        self._http = http

    def create(self, model: str, sandbox_config: Optional[Mapping[str, Any]] = None,
               security_policy: Optional[Mapping[str, Any]] = None, template: Optional[str] = None,
               timeout: Optional[float] = None, metadata: Optional[Mapping[str, str]] = None) -> Session:
        body: Dict[str, Any] = {"model": model}
        for k, v in (("sandbox_config", sandbox_config), ("security_policy", security_policy),
                     ("template", template), ("timeout", timeout), ("metadata", metadata)):
            if v is not None:
                body[k] = v
        return Session.from_dict(self._http.post_json("/v1/sessions", body))

    def get(self, session_id: str) -> Session:
        return Session.from_dict(self._http.get_json(f"/v1/sessions/{path_segment(session_id)}"))

    def delete(self, session_id: str) -> None:
        self._http.delete(f"/v1/sessions/{path_segment(session_id)}")

    def ask(self, session_id: str, prompt: str,
            files: Union[Mapping[str, Union[str, bytes]], Sequence[Mapping[str, Any]], None] = None,
            max_steps: Optional[int] = None, timeout_ms: Optional[int] = None,
            on_step: Optional[Callable[[Step], None]] = None) -> Answer:
        """Ask the session's model. files maps paths (under /home/user) to
        their text or bytes. on_step, when given, is called with each step
        as it happens (the answer is streamed)."""
        body: Dict[str, Any] = {"prompt": prompt}
        if files:
            body["files"] = _files(files)
        if max_steps is not None:
            body["max_steps"] = max_steps
        if timeout_ms is not None:
            body["timeout_ms"] = timeout_ms
        path = f"/v1/sessions/{path_segment(session_id)}/ask"
        # The server bounds the ask; the socket waits a little longer.
        wait = (timeout_ms or 300_000) / 1000 + 60
        if on_step is None:
            return Answer.from_dict(self._http.post_json(path, body, timeout=wait))
        resp = self._http.request("POST", path, json_body=body, params={"stream": "1"},
                                  headers={"Accept": "application/x-ndjson"}, timeout=wait)
        try:
            for ev in resp.iter_ndjson():
                typ = ev.get("type")
                if typ == "step":
                    on_step(Step.from_dict(ev.get("step") or {}))
                elif typ == "done":
                    return Answer.from_dict(ev.get("answer") or {})
                elif typ == "failure":
                    raise_failure(ev)
        finally:
            resp.close()
        raise SheepfoldError("the ask's stream ended without an answer", code="ERR_PROTOCOL")


class Monitor:
    """A session's events as they happen."""

    def __init__(self, http: HTTPClient, session_id: str) -> None:
        self._http = http
        self.session_id = session_id

    def stream(self, types: Optional[Sequence[str]] = None) -> Iterator[Event]:
        """Yield the session's events (event.timestamp, event.type,
        event.details), from its first; ends when the session ends."""
        return Events(http=self._http, sandbox_id=self.session_id).stream(types=types)

    def terminate_session(self, session_id: Optional[str] = None) -> None:
        """End the session (and its sandbox)."""
        self._http.delete(f"/v1/sessions/{path_segment(session_id or self.session_id)}")


class SandboxAPI:
    def __init__(self, http: HTTPClient) -> None:
        self._http = http

    def execute(self, session_id: str, code: str, language: str = "python",
                timeout_ms: Optional[int] = None) -> SessionExecution:
        body: Dict[str, Any] = {"code": code, "language": language}
        if timeout_ms is not None:
            body["timeout_ms"] = timeout_ms
        wait = None if timeout_ms is None else timeout_ms / 1000 + 60
        kw: Dict[str, Any] = {} if wait is None else {"timeout": max(wait, self._http.request_timeout or 0)}
        return SessionExecution.from_dict(
            self._http.post_json(f"/v1/sessions/{path_segment(session_id)}/execute", body, **kw))

    def apply_policy(self, session_id: str, policy: Mapping[str, Any]) -> Dict[str, Any]:
        """Apply ``policy`` over the session's security policy and return
        {policy, restart_required, loosened}: each section it sets replaces
        that section whole, each it leaves out keeps its rules (so seed
        002's policy, which has no ``filesystem`` section, keeps the
        filesystem rules of ``sandbox_config``); memory_mb and disk_write_mb
        resize the running sandbox (see Sandbox.set_policy)."""
        return self._http.request("PUT", f"/v1/sandboxes/{path_segment(session_id)}/policy",
                                  json_body=dict(policy)).json()

    def get_policy(self, session_id: str) -> Dict[str, Any]:
        return self._http.get_json(f"/v1/sandboxes/{path_segment(session_id)}/policy")

    def monitor(self, session_id: str) -> Monitor:
        return Monitor(self._http, session_id)


class Alerts:
    def __init__(self, http: HTTPClient) -> None:
        self._http = http

    def create(self, severity: str, message: str, session_id: Optional[str] = None,
               sandbox_id: Optional[str] = None) -> Alert:
        body: Dict[str, Any] = {"severity": severity, "message": message}
        if session_id:
            body["session_id"] = session_id
        if sandbox_id:
            body["sandbox_id"] = sandbox_id
        return Alert.from_dict(self._http.post_json("/v1/alerts", body))

    def list(self, unacknowledged: bool = False) -> List[Alert]:
        doc = self._http.get_json("/v1/alerts", params={"unacknowledged": unacknowledged}) or {}
        return [Alert.from_dict(a) for a in doc.get("alerts") or []]


class AccountAPI:
    def __init__(self, http: HTTPClient) -> None:
        self._http = http

    def get_usage(self) -> Usage:
        return Usage.from_dict(self._http.get_json("/v1/account/usage"))

    def get_credits(self) -> Credits:
        return Credits.from_dict(self._http.get_json("/v1/account/credits"))


class Models:
    def __init__(self, http: HTTPClient) -> None:
        self._http = http

    def list(self) -> List[str]:
        """The names of the models the server's providers serve."""
        doc = self._http.get_json("/v1/models") or {}
        return [m["id"] for m in doc.get("data") or []]


class Client:
    """One server, one key: ``sessions``, ``sandbox``, ``alerts``, ``account``, ``models``.

    base_url may end in /v1 (as an OpenAI client's does) or not;
    SHEEPFOLD_API_KEY and SHEEPFOLD_URL are the defaults.
    """

    def __init__(self, api_key: Optional[str] = None, base_url: Optional[str] = None, *,
                 request_timeout: Optional[float] = 120.0) -> None:
        base_url = base_url or os.environ.get("SHEEPFOLD_URL")
        if base_url:
            base_url = base_url.rstrip("/")
            if base_url.endswith("/v1"):
                base_url = base_url[:-3]
        self._http = HTTPClient(api_key=api_key, base_url=base_url, request_timeout=request_timeout)
        self.sessions = Sessions(self._http)
        self.sandbox = SandboxAPI(self._http)
        self.alerts = Alerts(self._http)
        self.account = AccountAPI(self._http)
        self.models = Models(self._http)
