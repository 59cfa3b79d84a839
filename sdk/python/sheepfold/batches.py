"""Batch jobs: one function over many inputs, each input in a fresh
sandbox of the account, under the account's limits.

    from sheepfold import Batches

    b = Batches().create("def handler(item):\\n    return len(item)\\n",
                         ["a", "bb", "ccc"], concurrency=8)
    b = Batches().wait(b.id)
    for r in Batches().results(b.id):
        print(r.index, r.result if r.status == "done" else r.error.name)

A batch whose code does not parse, or binds no handler, raises
InvalidHandlerError from create, before any item runs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Dict, Iterator, List, Optional, Tuple

from ._http import HTTPClient, path_segment
from .models import Resources, parse_time

__all__ = ["Batch", "BatchError", "BatchItemError", "BatchResult", "BatchUsage", "Batches"]


@dataclass
class BatchError:
    """Why a batch failed as a whole (credits or a quota ran out)."""
    code: str
    message: str

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "BatchError":
        return cls(code=d.get("code", ""), message=d.get("message", ""))


@dataclass
class BatchUsage:
    """What a batch's sandboxes used (its check's, where it took one), summed as each
    ended, and its cost at the operator's prices. The account is charged
    the same through the sandboxes' own metering."""
    sandboxes: int = 0
    sandbox_seconds: float = 0.0
    cpu_seconds: float = 0.0
    gb_seconds_reserved: float = 0.0
    gb_seconds_used: float = 0.0
    executions: int = 0
    cost_micros: int = 0
    cost: str = ""

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "BatchUsage":
        return cls(sandboxes=int(d.get("sandboxes") or 0), sandbox_seconds=float(d.get("sandbox_seconds") or 0),
                   cpu_seconds=float(d.get("cpu_seconds") or 0),
                   gb_seconds_reserved=float(d.get("gb_seconds_reserved") or 0),
                   gb_seconds_used=float(d.get("gb_seconds_used") or 0), executions=int(d.get("executions") or 0),
                   cost_micros=int(d.get("cost_micros") or 0), cost=d.get("cost", ""))


@dataclass
class Batch:
    id: str
    status: str  # running, done, canceled or failed
    template: str
    language: str
    concurrency: int
    timeout_ms: int
    retries: int
    resources: Optional[Resources]
    total: int
    done: int
    failed: int
    pending: int
    created_at: Optional[datetime]
    ended_at: Optional[datetime]
    error: Optional[BatchError]
    reuse: str = ""  # "" (a fresh sandbox per item) or "worker"
    usage: Optional[BatchUsage] = None

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "Batch":
        return cls(id=d["id"], status=d.get("status", ""), template=d.get("template", ""),
                   language=d.get("language", ""), concurrency=int(d.get("concurrency") or 0),
                   timeout_ms=int(d.get("timeout_ms") or 0), retries=int(d.get("retries") or 0),
                   resources=Resources.from_dict(d["resources"]) if d.get("resources") else None,
                   total=int(d.get("total") or 0), done=int(d.get("done") or 0),
                   failed=int(d.get("failed") or 0), pending=int(d.get("pending") or 0),
                   created_at=parse_time(d.get("created_at")), ended_at=parse_time(d.get("ended_at")),
                   error=BatchError.from_dict(d["error"]) if d.get("error") else None,
                   reuse=d.get("reuse") or "", usage=BatchUsage.from_dict(d.get("usage") or {}))


@dataclass
class BatchItemError:
    """How an item failed: the handler's exception, or the run's code."""
    name: str
    value: str
    traceback: str = ""
    code: str = ""

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "BatchItemError":
        return cls(name=d.get("name", ""), value=d.get("value", ""), traceback=d.get("traceback", ""),
                   code=d.get("code", ""))


@dataclass
class BatchResult:
    """An ended item, by its index in the inputs: result (the handler's
    return value) when done, error when failed."""
    index: int
    status: str
    attempts: int
    result: Any
    error: Optional[BatchItemError]
    ended_at: Optional[datetime]

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "BatchResult":
        return cls(index=int(d["index"]), status=d.get("status", ""), attempts=int(d.get("attempts") or 0),
                   result=d.get("result"),
                   error=BatchItemError.from_dict(d["error"]) if d.get("error") else None,
                   ended_at=parse_time(d.get("ended_at")))


class Batches:
    """The key owner's batches. NotFoundError for another account's."""

    def __init__(self, api_key: Optional[str] = None, base_url: Optional[str] = None, *,
                 http: Optional[HTTPClient] = None) -> None:
        self._http = http or HTTPClient(api_key=api_key, base_url=base_url)

    def create(self, code: str, inputs: Optional[List[Any]] = None, *, concurrency: Optional[int] = None,
               timeout_ms: Optional[int] = None, retries: Optional[int] = None,
               template: Optional[str] = None, language: Optional[str] = None,
               resources: Optional[Resources] = None, reuse: Optional[str] = None,
               inputs_file: Optional[Tuple[str, str]] = None) -> Batch:
        """Start a batch over inputs, or over inputs_file: (volume, path) of
        a JSON Lines file in one of the account's volumes. reuse="worker"
        keeps one sandbox per worker (the code runs once in it)."""
        body: Dict[str, Any] = {"code": code}
        if inputs_file is not None:
            body["inputs_file"] = {"volume": inputs_file[0], "path": inputs_file[1]}
        if inputs is not None:
            body["inputs"] = list(inputs)
        if resources is not None:
            body["resources"] = resources.to_dict()
        for k, v in (("concurrency", concurrency), ("timeout_ms", timeout_ms), ("retries", retries),
                     ("template", template), ("language", language), ("reuse", reuse)):
            if v is not None:
                body[k] = v
        return Batch.from_dict(self._http.post_json("/v1/batches", body))

    def get(self, batch_id: str) -> Batch:
        return Batch.from_dict(self._http.get_json(f"/v1/batches/{path_segment(batch_id)}"))

    def list(self) -> List[Batch]:
        doc = self._http.get_json("/v1/batches") or {}
        return [Batch.from_dict(b) for b in doc.get("batches") or []]

    def cancel(self, batch_id: str) -> Batch:
        return Batch.from_dict(self._http.post_json(f"/v1/batches/{path_segment(batch_id)}/cancel"))

    def wait(self, batch_id: str, poll: float = 1.0, timeout: Optional[float] = None) -> Batch:
        """Poll until the batch is no longer running; TimeoutError past timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            b = self.get(batch_id)
            if b.status != "running":
                return b
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"batch {batch_id} still running")
            time.sleep(poll)

    def results(self, batch_id: str, page: int = 1000) -> Iterator[BatchResult]:
        """Yield the ended items by index, every page of them."""
        after = -1
        while True:
            resp = self._http.request("GET", f"/v1/batches/{path_segment(batch_id)}/results",
                                      params={"after": after, "limit": page},
                                      headers={"Accept": "application/x-ndjson"})
            nxt = resp.headers.get("Sheepfold-Next-After")
            for obj in resp.iter_ndjson():
                yield BatchResult.from_dict(obj)
            if not nxt:
                return
            after = int(nxt)
