"""``sandbox.commands``: processes in the sandbox."""

from __future__ import annotations

import base64
from typing import Any, Callable, Dict, Iterator, List, Optional, Union

from ._http import HTTPClient, path_segment, raise_failure
from .errors import NotFoundError, SheepfoldError
from .models import CommandResult, ProcessInfo

__all__ = ["Commands", "CommandHandle"]

OutputHandler = Callable[[str], Any]


def _consume(events: Iterator[Dict[str, Any]], on_stdout: Optional[OutputHandler],
             on_stderr: Optional[OutputHandler], on_start: Optional[Callable[[int], Any]] = None) -> CommandResult:
    """Read a command's NDJSON events (start, stdout, stderr, done) to the end."""
    out: List[str] = []
    err: List[str] = []
    pid = 0
    for ev in events:
        t = ev.get("type")
        if t == "start":
            pid = ev.get("pid", 0) or 0
            if on_start:
                on_start(pid)
        elif t == "stdout":
            text = ev.get("text", "")
            out.append(text)
            if on_stdout:
                on_stdout(text)
        elif t == "stderr":
            text = ev.get("text", "")
            err.append(text)
            if on_stderr:
                on_stderr(text)
        elif t == "done":
            body = ev.get("command")
            if body is None:  # be lenient about the key's name
                body = ev.get("result", ev.get("process", {k: v for k, v in ev.items() if k != "type"}))
            res = CommandResult.from_dict(body, stdout="".join(out), stderr="".join(err))
            if not res.pid:
                res.pid = pid
            return res
        elif t == "failure":
            raise_failure(ev)
        elif t is None and "exit_code" in ev:
            # A server that answered with plain JSON instead of a stream.
            return CommandResult.from_dict(ev)
    raise SheepfoldError("the command's stream ended without a done event", code="ERR_PROTOCOL")


class CommandHandle:
    """A background command (``commands.run(..., background=True)``)."""

    def __init__(self, commands: "Commands", pid: int) -> None:
        self._commands = commands
        self.pid = pid

    def wait(self, on_stdout: Optional[OutputHandler] = None, on_stderr: Optional[OutputHandler] = None,
             request_timeout: Optional[float] = None) -> CommandResult:
        """Follow the process's output from now until it ends; return how it ended.

        Output written before wait() was called is not replayed.
        """
        return self._commands._follow(self.pid, on_stdout, on_stderr, request_timeout)

    def kill(self, signal: Union[str, int] = "SIGKILL") -> bool:
        """Signal the process (SIGKILL by default). False if it no longer exists."""
        return self._commands.kill(self.pid, signal)

    def send_stdin(self, data: Union[str, bytes], eof: bool = False) -> None:
        self._commands.send_stdin(self.pid, data, eof=eof)

    def close_stdin(self) -> None:
        self._commands.close_stdin(self.pid)

    def __repr__(self) -> str:
        return f"CommandHandle(pid={self.pid})"


class Commands:
    """Run and manage processes in one sandbox (``sandbox.commands``)."""

    def __init__(self, http: HTTPClient, sandbox_id: str) -> None:
        self._http = http
        self._base = f"/v1/sandboxes/{path_segment(sandbox_id)}/commands"

    def run(
        self,
        cmd: str,
        background: bool = False,
        envs: Optional[Dict[str, str]] = None,
        cwd: Optional[str] = None,
        timeout: Optional[float] = None,
        on_stdout: Optional[OutputHandler] = None,
        on_stderr: Optional[OutputHandler] = None,
        stdin: bool = False,
        request_timeout: Optional[float] = None,
    ) -> Union[CommandResult, CommandHandle]:
        """Run a shell command line (``/bin/bash -c cmd``).

        Foreground (default): wait for it and return a CommandResult (a
        non-zero exit code does not raise). With on_stdout/on_stderr the
        output is streamed to them as it comes.

        background=True: return a CommandHandle at once; the process
        outlives the request. Pass stdin=True to keep its stdin open for
        send_stdin().

        timeout is in seconds. Left out (None), a foreground command gets
        60 s and a background one none: it lives as long as its sandbox.
        0 is the server's default (the same).
        """
        return self.exec("/bin/bash", ["-c", cmd], background=background, envs=envs, cwd=cwd,
                         timeout=timeout, on_stdout=on_stdout, on_stderr=on_stderr, stdin=stdin,
                         request_timeout=request_timeout)

    def exec(
        self,
        cmd: str,
        args: Optional[List[str]] = None,
        background: bool = False,
        envs: Optional[Dict[str, str]] = None,
        cwd: Optional[str] = None,
        timeout: Optional[float] = None,
        on_stdout: Optional[OutputHandler] = None,
        on_stderr: Optional[OutputHandler] = None,
        stdin: bool = False,
        request_timeout: Optional[float] = None,
    ) -> Union[CommandResult, CommandHandle]:
        """Like run(), but an executable and its arguments, without a shell."""
        if timeout is None and not background:
            timeout = 60
        body: Dict[str, Any] = {"cmd": cmd, "args": list(args or [])}
        if envs:
            body["env"] = dict(envs)
        if cwd:
            body["cwd"] = cwd
        if timeout:
            body["timeout_ms"] = int(round(timeout * 1000))
        if background:
            body["background"] = True
        if stdin:
            body["stdin"] = True
        if background:
            doc = self._http.post_json(self._base, body) or {}
            return CommandHandle(self, int(doc.get("pid", 0)))
        rt = request_timeout if request_timeout is not None else (timeout + 30 if timeout else None)
        if on_stdout or on_stderr:
            resp, events = self._http.stream_ndjson("POST", self._base, json_body=body, timeout=rt)
            try:
                return _consume(events, on_stdout, on_stderr)
            finally:
                resp.close()
        return CommandResult.from_dict(self._http.post_json(self._base, body, timeout=rt))

    def _follow(self, pid: int, on_stdout: Optional[OutputHandler], on_stderr: Optional[OutputHandler],
                request_timeout: Optional[float]) -> CommandResult:
        resp, events = self._http.stream_ndjson("GET", f"{self._base}/{path_segment(pid)}/stream",
                                                timeout=request_timeout)
        try:
            res = _consume(events, on_stdout, on_stderr)
        finally:
            resp.close()
        if not res.pid:
            res.pid = pid
        return res

    def connect(self, pid: int) -> CommandHandle:
        """A handle on a running process, e.g. one from list()."""
        return CommandHandle(self, pid)

    def list(self) -> List[ProcessInfo]:
        """The running processes started through the commands API."""
        doc = self._http.get_json(self._base) or {}
        return [ProcessInfo.from_dict(p) for p in doc.get("processes") or []]

    def kill(self, pid: int, signal: Union[str, int] = "SIGKILL") -> bool:
        """Signal a process (SIGKILL by default; a name or a number).
        Returns False if the process does not exist (any more)."""
        try:
            self._http.request("POST", f"{self._base}/{path_segment(pid)}/signal",
                               json_body={"signal": signal}).read()
        except NotFoundError as e:
            if e.code == "ERR_SANDBOX_NOT_FOUND":
                raise
            return False
        return True

    def send_signal(self, pid: int, signal: Union[str, int]) -> bool:
        return self.kill(pid, signal)

    def send_stdin(self, pid: int, data: Union[str, bytes], eof: bool = False) -> None:
        """Write to a process's stdin (it must have been started with stdin=True).
        eof=True closes stdin after the data."""
        body: Dict[str, Any] = {}
        if isinstance(data, str):
            body["data"] = data
        else:
            body["data_base64"] = base64.b64encode(bytes(data)).decode("ascii")
        if eof:
            body["eof"] = True
        self._http.request("POST", f"{self._base}/{path_segment(pid)}/input", json_body=body).read()

    def close_stdin(self, pid: int) -> None:
        self.send_stdin(pid, "", eof=True)
