"""Sandbox events (listed, or streamed live as Server-Sent Events) and webhooks.

    from sheepfold import Events, Webhooks

    for ev in sb.events.stream():          # one sandbox: replays, then live, ends at its stop
        print(ev.type, ev.details)
    page = Events().list(types=["security_violation"], limit=50)   # every sandbox of the key's owner

    hook = Webhooks().create("https://example.com/hook", types=["sandbox.stopped"])
    print(hook.secret)                     # shown once: keep it to check signatures (verify_webhook)
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Dict, Iterator, List, Optional, Sequence, Union

from ._http import HTTPClient, path_segment, raise_failure
from .errors import SheepfoldError
from .models import parse_time

__all__ = ["Event", "EventPage", "Events", "Webhook", "WebhookDelivery", "Webhooks", "verify_webhook"]


@dataclass
class Event:
    """Something that happened to a sandbox (sandbox.created, sandbox.stopped,
    execution.started, execution.finished, security_violation,
    resource_exceeded, policy.changed)."""

    id: int
    type: str
    timestamp: Optional[datetime]
    sandbox_id: Optional[str] = None
    execution_id: Optional[str] = None
    details: Dict[str, Any] = field(default_factory=dict)
    # Who recorded it: "host" (the server), "gateway" (the egress gateway),
    # "agent" (the agent in the sandbox, which saw it itself) or "sandbox"
    # (the code in the sandbox said so, and could have written it itself).
    source: Optional[str] = None

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "Event":
        return cls(id=int(d.get("id") or 0), type=d.get("type", ""), timestamp=parse_time(d.get("timestamp")),
                   sandbox_id=d.get("sandbox_id"), execution_id=d.get("execution_id"),
                   details=dict(d.get("details") or {}), source=d.get("source"))


@dataclass
class EventPage:
    events: List[Event]
    next_cursor: Optional[str]  # pass as cursor for the next page; None on the last


def _since(since: Union[datetime, str, None]) -> Optional[str]:
    if isinstance(since, datetime):
        return since.isoformat().replace("+00:00", "Z") if since.tzinfo else since.isoformat() + "Z"
    return since


class Events:
    """The events of every sandbox of the key's owner, or of one sandbox
    (``sandbox.events``)."""

    def __init__(self, api_key: Optional[str] = None, base_url: Optional[str] = None, *,
                 http: Optional[HTTPClient] = None, sandbox_id: Optional[str] = None) -> None:
        self._http = http or HTTPClient(api_key=api_key, base_url=base_url)
        self._sandbox_id = sandbox_id
        self._path = f"/v1/sandboxes/{path_segment(sandbox_id)}/events" if sandbox_id else "/v1/events"

    def _params(self, types: Optional[Sequence[str]], since: Any, cursor: Optional[Union[str, int]],
                limit: Optional[int], sandbox_id: Optional[str]) -> Dict[str, Any]:
        return {"type": ",".join(types) if types else None, "since": _since(since),
                "cursor": str(cursor) if cursor is not None else None, "limit": limit,
                "sandbox": sandbox_id if not self._sandbox_id else None}

    def list(self, types: Optional[Sequence[str]] = None, since: Union[datetime, str, None] = None,
             cursor: Optional[Union[str, int]] = None, limit: Optional[int] = None,
             sandbox_id: Optional[str] = None) -> EventPage:
        """One page of stored events, oldest first."""
        doc = self._http.get_json(self._path, params=self._params(types, since, cursor, limit, sandbox_id)) or {}
        return EventPage(events=[Event.from_dict(e) for e in doc.get("events") or []],
                         next_cursor=doc.get("next_cursor"))

    def stream(self, types: Optional[Sequence[str]] = None, since: Union[datetime, str, None] = None,
               cursor: Optional[Union[str, int]] = None, sandbox_id: Optional[str] = None) -> Iterator[Event]:
        """Yield events as they happen.

        A sandbox's stream first replays its events (after ``cursor`` when
        given) and ends after ``sandbox.stopped``; the account's stream starts
        with new events (unless ``cursor`` or ``since`` asks for a replay) and
        runs until the caller stops iterating. If the server drops the stream
        because the reader fell behind, it is resumed after the last event
        seen: nothing is missed or repeated. If the server cuts it off as it
        shuts down, the error (``ERR_SHUTTING_DOWN``) is raised: resume with
        ``cursor`` set to the last event's id.
        """
        last = str(cursor) if cursor is not None else None
        while True:
            lagged = False
            params = self._params(types, since, last, None, sandbox_id)
            resp = self._http.request("GET", self._path, params=params,
                                      headers={"Accept": "text/event-stream"}, timeout=None)
            typ = ident = None
            try:
                for raw in resp.iter_lines():
                    line = raw.decode("utf-8", "replace")
                    if line.startswith("id: "):
                        ident = line[4:]
                    elif line.startswith("event: "):
                        typ = line[7:]
                    elif line.startswith("data: "):
                        if typ == "lagged":
                            lagged = True
                            break
                        try:
                            doc = json.loads(line[6:])
                        except ValueError as e:
                            raise SheepfoldError(f"the server sent an invalid event: {line[:200]!r}",
                                                 code="ERR_PROTOCOL") from e
                        if typ == "failure":
                            # The server cut the stream off (ERR_SHUTTING_DOWN
                            # while it shuts down): resume with cursor=last.
                            raise_failure(doc)
                        if ident:
                            last = ident
                        typ = ident = None
                        yield Event.from_dict(doc)
            finally:
                resp.close()
            if not lagged:
                return


@dataclass
class Webhook:
    id: str
    url: str
    types: List[str]
    created_at: Optional[datetime]
    secret: Optional[str] = None  # only in the answer to create()

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "Webhook":
        return cls(id=d["id"], url=d.get("url", ""), types=list(d.get("types") or []),
                   created_at=parse_time(d.get("created_at")), secret=d.get("secret"))


@dataclass
class WebhookDelivery:
    id: int
    event_id: int
    event_type: str
    attempt: int
    status_code: int
    succeeded: bool
    timestamp: Optional[datetime]
    duration_ms: float = 0.0
    error: Optional[str] = None

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "WebhookDelivery":
        return cls(id=int(d.get("id") or 0), event_id=int(d.get("event_id") or 0), event_type=d.get("event_type", ""),
                   attempt=int(d.get("attempt") or 0), status_code=int(d.get("status_code") or 0),
                   succeeded=bool(d.get("succeeded")), timestamp=parse_time(d.get("timestamp")),
                   duration_ms=float(d.get("duration_ms") or 0), error=d.get("error"))


class Webhooks:
    """The key owner's webhooks: URLs every event is POSTed to, signed."""

    def __init__(self, api_key: Optional[str] = None, base_url: Optional[str] = None, *,
                 http: Optional[HTTPClient] = None) -> None:
        self._http = http or HTTPClient(api_key=api_key, base_url=base_url)

    def create(self, url: str, types: Optional[Sequence[str]] = None) -> Webhook:
        """Register url; keep the returned ``secret``: it is not shown again."""
        body: Dict[str, Any] = {"url": url}
        if types:
            body["types"] = list(types)
        return Webhook.from_dict(self._http.post_json("/v1/webhooks", body))

    def list(self) -> List[Webhook]:
        doc = self._http.get_json("/v1/webhooks") or {}
        return [Webhook.from_dict(w) for w in doc.get("webhooks") or []]

    def delete(self, webhook_id: str) -> None:
        self._http.delete(f"/v1/webhooks/{path_segment(webhook_id)}")

    def deliveries(self, webhook_id: str, cursor: Optional[Union[str, int]] = None,
                   limit: Optional[int] = None) -> "tuple[List[WebhookDelivery], Optional[str]]":
        """A page of the webhook's delivery log and the cursor of the next one."""
        doc = self._http.get_json(f"/v1/webhooks/{path_segment(webhook_id)}/deliveries",
                                  params={"cursor": str(cursor) if cursor is not None else None, "limit": limit}) or {}
        return [WebhookDelivery.from_dict(d) for d in doc.get("deliveries") or []], doc.get("next_cursor")


def verify_webhook(secret: str, timestamp: str, signature: str, body: bytes, tolerance: float = 300.0) -> bool:
    """Check a delivery: the Sheepfold-Timestamp and Sheepfold-Signature
    headers and the raw body. False for a wrong signature or a timestamp
    further than ``tolerance`` seconds from now (a replay)."""
    try:
        ts = int(timestamp)
    except (TypeError, ValueError):
        return False
    if abs(time.time() - ts) > tolerance:
        return False
    mac = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    return hmac.compare_digest("v1=" + mac, signature or "")
