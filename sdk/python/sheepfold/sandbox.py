"""The Sandbox class: create, connect to, use and kill a Sheepfold sandbox."""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence, Union

from ._http import HTTPClient, path_segment, raise_failure
from .commands import Commands
from .events import Events
from .errors import NotFoundError, SandboxStateError, SheepfoldError
from .files import Filesystem
from .models import Adopted, CodeContext, Diff, Execution, ExecutionError, PolicyAnswer, Resources, Result, SandboxInfo, SnapshotInfo, SnapshotPool
from .ports import Port, PortList
from .volumes import VolumeMount

__all__ = ["Sandbox"]

# The socket timeout of run_code when neither timeout nor request_timeout is given.
DEFAULT_EXECUTE_REQUEST_TIMEOUT = 600.0


class Sandbox:
    """A running sandbox.

    Make one with :meth:`create` (or attach to one with :meth:`connect`);
    use it as a context manager to kill it on exit::

        with Sandbox.create() as sb:
            print(sb.run_code("1 + 1").text)

    api_key and base_url default to the environment variables
    SHEEPFOLD_API_KEY and SHEEPFOLD_URL (default http://127.0.0.1:8080).
    """

    def __init__(self, info: SandboxInfo, http: HTTPClient) -> None:
        self._http = http
        self._info = info
        self.sandbox_id: str = info.sandbox_id
        self._base = f"/v1/sandboxes/{path_segment(self.sandbox_id)}"
        self.files = Filesystem(http, self.sandbox_id)
        self.commands = Commands(http, self.sandbox_id)
        self.events = Events(http=http, sandbox_id=self.sandbox_id)

    # Lifecycle.

    @classmethod
    def create(
        cls,
        template: Optional[str] = None,
        timeout: Optional[float] = None,
        metadata: Optional[Dict[str, str]] = None,
        envs: Optional[Dict[str, str]] = None,
        resources: Optional[Union[Resources, Dict[str, Any]]] = None,
        sandbox_config: Optional[Dict[str, Any]] = None,
        security_policy: Optional[Dict[str, Any]] = None,
        volume_mounts: Optional[Sequence[Union[VolumeMount, Dict[str, Any]]]] = None,
        api_key: Optional[str] = None,
        base_url: Optional[str] = None,
        request_timeout: Optional[float] = None,
        snapshot: Optional[str] = None,
        auto_pause: bool = False,
    ) -> "Sandbox":
        """Create a sandbox.

        Args:
            template: the template ("python" by default on the server).
            timeout: seconds the sandbox lives before it is stopped
                (extend it with set_timeout).
            metadata: string labels kept with the sandbox.
            envs: environment variables for everything run in it.
            resources: {"cpus", "memory_mb", "disk_mb", "pids", "gpu",
                "devices"} (or Resources); gpu asks for a number of GPUs,
                devices for devices by CDI name (DeviceNotFoundError,
                DeviceInUseError when held by another sandbox).
            sandbox_config: {"max_execution_time", "max_memory_mb",
                "network_restricted", "filesystem_readonly"}.
            security_policy: the sandbox's security policy, the JSON object of
                the README's "Policies and network" (resource_limits,
                access_control, filesystem, network, output_filtering,
                rate_limiting, on_violation); a bad one raises
                InvalidPolicyError naming the field.
            volume_mounts: the account's volumes to mount when it starts
                (VolumeMount, or {"name", "path", "read_only", "shared"});
                VolumeNotFoundError for a name the account has not,
                VolumeInUseError for a second writer.
            request_timeout: the HTTP timeout in seconds of each API call
                (default 60; run_code and commands.run use their own).
            snapshot: start from this snapshot of your account's
                (create_snapshot): its processes, memory and files, with
                the template, resources, environment and policy it
                recorded (so leave those unset).
            auto_pause: pause the sandbox instead of stopping it when its
                lifetime (or the server's idle timeout) ends, once it is
                idle; any request resumes it (E2B's autoPause).
        """
        http = cls._client(api_key, base_url, request_timeout)
        body: Dict[str, Any] = {}
        if snapshot is not None:
            body["snapshot"] = snapshot
        if template is not None:
            body["template"] = template
        if timeout is not None:
            body["timeout"] = timeout
        if resources is not None:
            body["resources"] = resources.to_dict() if isinstance(resources, Resources) else dict(resources)
        if envs:
            body["env"] = dict(envs)
        if metadata:
            body["metadata"] = dict(metadata)
        if sandbox_config:
            body["sandbox_config"] = dict(sandbox_config)
        if security_policy is not None:
            body["security_policy"] = dict(security_policy)
        if volume_mounts:
            body["volume_mounts"] = [m.to_dict() if isinstance(m, VolumeMount) else dict(m) for m in volume_mounts]
        if auto_pause:
            body["auto_pause"] = True
        info = SandboxInfo.from_dict(http.post_json("/v1/sandboxes", body))
        return cls(info, http)

    @classmethod
    def connect(cls, sandbox_id: str, api_key: Optional[str] = None, base_url: Optional[str] = None,
                request_timeout: Optional[float] = None) -> "Sandbox":
        """Attach to an existing sandbox of yours (raises NotFoundError if it is not)."""
        http = cls._client(api_key, base_url, request_timeout)
        info = SandboxInfo.from_dict(http.get_json(f"/v1/sandboxes/{path_segment(sandbox_id)}"))
        return cls(info, http)

    @classmethod
    def list(cls, api_key: Optional[str] = None, base_url: Optional[str] = None, all: bool = False,
             request_timeout: Optional[float] = None, state: Optional[str] = None) -> List[SandboxInfo]:
        """Your running and paused sandboxes (all=True adds the stopped
        ones; state="running" or "paused" lists only those)."""
        http = cls._client(api_key, base_url, request_timeout)
        doc = http.get_json("/v1/sandboxes", params={"state": "all" if all else state}) or {}
        return [SandboxInfo.from_dict(s) for s in doc.get("sandboxes") or []]

    @staticmethod
    def _client(api_key: Optional[str], base_url: Optional[str], request_timeout: Optional[float]) -> HTTPClient:
        if request_timeout is None:
            return HTTPClient(api_key=api_key, base_url=base_url)
        return HTTPClient(api_key=api_key, base_url=base_url, request_timeout=request_timeout)

    def kill(self) -> bool:
        """Stop and delete the sandbox.

        Returns True when the sandbox is stopped now (also when it had
        already stopped), False when the server does not know it.
        """
        try:
            self._http.delete(self._base)
        except NotFoundError:
            return False
        return True

    def pause(self, keep_memory: bool = False) -> SandboxInfo:
        """Checkpoint the sandbox to the server's disk and free its memory
        and processes; its files stay and its lifetime stands still. Any
        request that needs it, or resume(), resumes it. keep_memory=True
        freezes it instead: its processes stop where they are, their
        memory kept (and metered), and the resume takes milliseconds.

        Raises NotSupportedError where the server's runtime cannot
        checkpoint, SandboxStateError while a request of it is in flight.
        A sandbox with a network keeps its policy and request count; its
        connections open at the pause are closed."""
        body = {"memory": "keep"} if keep_memory else None
        self._info = SandboxInfo.from_dict(self._http.post_json(self._base + "/pause", body))
        return self._info

    def resume(self) -> SandboxInfo:
        """Restore a paused sandbox as it was (variables, background
        commands, files); a running one is left as it is."""
        self._info = SandboxInfo.from_dict(self._http.post_json(self._base + "/resume", None))
        return self._info

    # Snapshots.

    def create_snapshot(self, name: str) -> SnapshotInfo:
        """Save the running sandbox (processes, memory, files) under name,
        unique in your account, while it runs on. Raises ConflictError
        when the name is taken, SandboxStateError while a request of it
        is in flight, NotSupportedError where the server cannot."""
        return SnapshotInfo.from_dict(self._http.post_json(self._base + "/snapshots", {"name": name}))

    def fork(self, count: int = 1) -> List["Sandbox"]:
        """Make count (1 to 8) independent copies of the running sandbox,
        with its processes, memory and files, each a new sandbox of its
        own; this one runs on."""
        doc = self._http.post_json(self._base + "/fork", {"count": count}) or {}
        return [Sandbox(SandboxInfo.from_dict(s), self._http) for s in doc.get("sandboxes") or []]

    def diff(self, against: str) -> Diff:
        """What this fork added, changed and deleted in its files since it
        was forked from the sandbox ``against`` (NotFoundError when it is
        not such a fork)."""
        return Diff.from_dict(self._http.get_json(self._base + "/diff", params={"against": against}))

    def adopt(self) -> Adopted:
        """Copy this fork's changes since the fork (its diff) into its
        parent: files and directories it added or changed are written
        there, paths it deleted are removed (NotFoundError when this is
        not a fork)."""
        return Adopted.from_dict(self._http.post_json(self._base + "/adopt", None))

    @classmethod
    def list_snapshots(cls, api_key: Optional[str] = None, base_url: Optional[str] = None,
                       request_timeout: Optional[float] = None) -> List[SnapshotInfo]:
        """Your snapshots, oldest first."""
        http = cls._client(api_key, base_url, request_timeout)
        doc = http.get_json("/v1/snapshots") or {}
        return [SnapshotInfo.from_dict(s) for s in doc.get("snapshots") or []]

    @classmethod
    def get_snapshot(cls, name: str, api_key: Optional[str] = None, base_url: Optional[str] = None,
                     request_timeout: Optional[float] = None) -> SnapshotInfo:
        """One of your snapshots (NotFoundError if you have none so named)."""
        http = cls._client(api_key, base_url, request_timeout)
        return SnapshotInfo.from_dict(http.get_json(f"/v1/snapshots/{path_segment(name)}"))

    @classmethod
    def delete_snapshot(cls, name: str, api_key: Optional[str] = None, base_url: Optional[str] = None,
                        request_timeout: Optional[float] = None) -> None:
        """Delete a snapshot; sandboxes started from it run on. Raises
        ConflictError while sandboxes are being started from it."""
        http = cls._client(api_key, base_url, request_timeout)
        http.delete(f"/v1/snapshots/{path_segment(name)}")

    @classmethod
    def set_snapshot_pool(cls, name: str, size: int, api_key: Optional[str] = None, base_url: Optional[str] = None,
                          request_timeout: Optional[float] = None) -> SnapshotPool:
        """Keep size sandboxes restored from the snapshot name ahead of
        need (0: none), so that Sandbox.create(snapshot=name) skips the
        restore. Raises NotSupportedError when the server keeps no
        snapshot pools, SessionQuotaExceededError past your bound over
        all your pools."""
        http = cls._client(api_key, base_url, request_timeout)
        return SnapshotPool.from_dict(http.post_json(f"/v1/snapshots/{path_segment(name)}/pool", {"size": size}))

    @classmethod
    def get_snapshot_pool(cls, name: str, api_key: Optional[str] = None, base_url: Optional[str] = None,
                          request_timeout: Optional[float] = None) -> SnapshotPool:
        """The snapshot name's pool: its size and the members ready now."""
        http = cls._client(api_key, base_url, request_timeout)
        return SnapshotPool.from_dict(http.get_json(f"/v1/snapshots/{path_segment(name)}/pool"))

    def set_timeout(self, timeout: float) -> SandboxInfo:
        """Keep-alive: the sandbox now lives ``timeout`` seconds from now."""
        self._info = SandboxInfo.from_dict(self._http.post_json(self._base + "/timeout", {"timeout": timeout}))
        return self._info

    def get_info(self) -> SandboxInfo:
        """Fetch the sandbox's current description."""
        self._info = SandboxInfo.from_dict(self._http.get_json(self._base))
        return self._info

    @property
    def info(self) -> SandboxInfo:
        """The last known description (from create, connect, get_info or set_timeout)."""
        return self._info

    def is_running(self) -> bool:
        """Whether the sandbox is still running."""
        try:
            return self.get_info().state == "running"
        except (NotFoundError, SandboxStateError):
            return False

    # Preview ports.

    def list_ports(self, expires_in: Optional[float] = None) -> PortList:
        """The ports the sandbox listens on and the ports made public, each
        with its preview URLs, and the sandbox's preview token. Signed URLs
        live ``expires_in`` seconds (default: the server's, an hour)."""
        params = {"expires_in": int(expires_in)} if expires_in is not None else None
        return PortList.from_dict(self._http.get_json(self._base + "/ports", params=params))

    def set_port_public(self, port: int, public: bool = True) -> Port:
        """Make port's preview public (reachable without a credential) or
        private again; the port need not listen yet."""
        if isinstance(port, bool) or not isinstance(port, int):
            raise TypeError("port must be an int")
        return Port.from_dict(self._http.request("PUT", f"{self._base}/ports/{port}",
                                                 json_body={"public": bool(public)}).json())

    def get_preview_url(self, port: int, signed: bool = False, expires_in: Optional[float] = None) -> str:
        """The preview URL of port: the host form
        ``http://{port}-{id}.{preview domain}/`` when the server has a preview
        domain, else the path form ``.../v1/sandboxes/{id}/proxy/{port}/``
        (the path form for a port that neither listens nor is public yet).
        A private port's URL needs the token of :meth:`list_ports` in its
        header; with ``signed``, the URL a browser opens without it (it sets
        a cookie) until it expires, for a port that listens or is public
        (else NotFoundError).
        """
        if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
            raise ValueError("port must be an int from 1 to 65535")
        p = self.list_ports(expires_in).get(port)
        if signed:
            if p is None or not p.signed_url:
                raise NotFoundError(f"port {port} of sandbox {self.sandbox_id} neither listens nor is public")
            return p.signed_url
        if p is not None and p.preview_url:
            return p.preview_url
        return f"{self._http.base_url}{self._base}/proxy/{port}/"

    # Security policy.

    def get_policy(self) -> PolicyAnswer:
        """The sandbox's security policy ({} when none was given)."""
        return PolicyAnswer.from_dict(self._http.get_json(self._base + "/policy"))

    def set_policy(self, policy: Dict[str, Any]) -> PolicyAnswer:
        """Apply ``policy`` over the sandbox's security policy: each section
        it sets (``resource_limits``, ``access_control``...) replaces that
        section whole, each it leaves out keeps its rules, an empty one
        (``{}``) clears it; the answer holds the whole policy now.
        Tightening applies from the next execution with state kept; a
        loosening a running interpreter cannot apply answers
        ``restart_required``. ``resource_limits.memory_mb`` and
        ``disk_write_mb`` resize the running sandbox (above the account's
        maxima: InvalidPolicyError). Filesystem rules are fixed at create:
        changing them raises InvalidPolicyError."""
        resp = self._http.request("PUT", self._base + "/policy", json_body=dict(policy))
        return PolicyAnswer.from_dict(resp.json())

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            self.kill()
        except SheepfoldError:
            if exc[0] is None:
                raise

    def __repr__(self) -> str:
        return f"Sandbox(sandbox_id={self.sandbox_id!r}, base_url={self._http.base_url!r})"

    # Code execution.

    def run_code(
        self,
        code: str,
        language: Optional[str] = None,
        context: Optional[Union[CodeContext, str]] = None,
        on_stdout: Optional[Callable[[str], Any]] = None,
        on_stderr: Optional[Callable[[str], Any]] = None,
        on_result: Optional[Callable[[Result], Any]] = None,
        on_error: Optional[Callable[[ExecutionError], Any]] = None,
        envs: Optional[Dict[str, str]] = None,
        timeout: Optional[float] = None,
        request_timeout: Optional[float] = None,
    ) -> Execution:
        """Run code in the sandbox and return its Execution.

        Args:
            code: the source.
            language: "python" (the server's default), "javascript",
                "typescript", "bash", "r" or "java".
            context: a CodeContext (or its id) to run in; without one, the
                language's default context, whose state persists across calls.
            on_stdout, on_stderr: called with each output chunk as it comes.
            on_result: called with each Result (figures, display(), the last
                expression's value) as it comes.
            on_error: called with the ExecutionError if the code raised.
            envs: environment variables for this execution only.
            timeout: seconds the code may run (the sandbox's
                max_execution_time caps it).
            request_timeout: the HTTP socket timeout (default: timeout + 30 s,
                or 600 s).

        Any callback switches the request to NDJSON streaming; without
        callbacks, one JSON response. An exception in the code does not
        raise: see ``execution.error``.
        """
        body: Dict[str, Any] = {"code": code}
        if language:
            body["language"] = language
        if context is not None:
            body["context_id"] = context.id if isinstance(context, CodeContext) else str(context)
        if timeout:
            body["timeout_ms"] = int(round(timeout * 1000))
        if envs:
            body["env"] = dict(envs)
        rt = request_timeout
        if rt is None:
            rt = timeout + 30 if timeout else DEFAULT_EXECUTE_REQUEST_TIMEOUT
        path = self._base + "/execute"

        if not (on_stdout or on_stderr or on_result or on_error):
            return Execution.from_dict(self._http.post_json(path, body, timeout=rt))

        resp, events = self._http.stream_ndjson("POST", path, json_body=body, timeout=rt)
        try:
            return self._consume_execution(events, on_stdout, on_stderr, on_result, on_error)
        finally:
            resp.close()

    @staticmethod
    def _consume_execution(events: Any, on_stdout: Any, on_stderr: Any, on_result: Any, on_error: Any) -> Execution:
        stdout: List[str] = []
        stderr: List[str] = []
        results: List[Result] = []
        error: Optional[ExecutionError] = None
        for ev in events:
            t = ev.get("type")
            if t == "stdout":
                text = ev.get("text", "")
                stdout.append(text)
                if on_stdout:
                    on_stdout(text)
            elif t == "stderr":
                text = ev.get("text", "")
                stderr.append(text)
                if on_stderr:
                    on_stderr(text)
            elif t == "result":
                r = Result.from_dict(ev.get("result"))
                results.append(r)
                if on_result:
                    on_result(r)
            elif t == "error":
                e = ev.get("error") or {}
                if "code" in e and "name" not in e:  # an API error, not the code's exception
                    raise_failure(ev)
                error = ExecutionError.from_dict(e)
                if on_error:
                    on_error(error)
            elif t == "done" or (t is None and "status" in ev):
                ex = Execution.from_dict(ev.get("execution") if t == "done" else ev)
                # Keep the chunks as they were streamed; the done event's
                # copies of results and error are the authority.
                if stdout or stderr:
                    ex.logs.stdout, ex.logs.stderr = stdout, stderr
                if not ex.results and results:
                    ex.results = results
                if ex.error is None and error is not None:
                    ex.error = error
                return ex
            elif t == "failure":
                raise_failure(ev)
        raise SheepfoldError("the execution's stream ended without a done event", code="ERR_PROTOCOL")

    # Code contexts.

    def create_code_context(self, language: Optional[str] = None, cwd: Optional[str] = None) -> CodeContext:
        """A new interpreter context with its own state."""
        body: Dict[str, Any] = {}
        if language:
            body["language"] = language
        if cwd:
            body["cwd"] = cwd
        return CodeContext.from_dict(self._http.post_json(self._base + "/contexts", body))

    def list_code_contexts(self) -> List[CodeContext]:
        doc = self._http.get_json(self._base + "/contexts") or {}
        return [CodeContext.from_dict(c) for c in doc.get("contexts") or []]

    def restart_code_context(self, context: Union[CodeContext, str]) -> CodeContext:
        """Restart a context's interpreter, clearing its state."""
        cid = context.id if isinstance(context, CodeContext) else context
        return CodeContext.from_dict(
            self._http.post_json(f"{self._base}/contexts/{path_segment(cid)}/restart", {}))

    def remove_code_context(self, context: Union[CodeContext, str]) -> None:
        cid = context.id if isinstance(context, CodeContext) else context
        self._http.delete(f"{self._base}/contexts/{path_segment(cid)}")
