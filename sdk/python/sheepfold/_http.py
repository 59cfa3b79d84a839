"""A small HTTP client over http.client: auth, JSON, errors, retries, NDJSON."""

from __future__ import annotations

import email.utils
import http.client
import json
import os
import socket
import ssl
import time
import uuid
from datetime import datetime, timezone
from typing import Any, Callable, Dict, Iterator, Mapping, Optional, Tuple, Union
from urllib.parse import quote, urlencode, urlsplit

from ._version import __version__
from .errors import SheepfoldConnectionError, SheepfoldError, error_for

DEFAULT_BASE_URL = "http://127.0.0.1:8080"
DEFAULT_REQUEST_TIMEOUT = 60.0
# Statuses retried (when the request never started a stream): 429 always,
# 503 only when the server sent Retry-After (ERR_CAPACITY).
MAX_RETRIES = 3
MAX_RETRY_WAIT = 60.0

Params = Optional[Mapping[str, Any]]


def path_segment(value: Any) -> str:
    """Quote one path segment (an id, a pid)."""
    return quote(str(value), safe="")


def parse_retry_after(value: Optional[str]) -> Optional[float]:
    """Parse Retry-After: delta-seconds or an HTTP date. None if absent/bad."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when is None:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return max(0.0, (when - datetime.now(timezone.utc)).total_seconds())


class Response:
    """A response whose body may still be unread (for streams and downloads)."""

    def __init__(self, conn: http.client.HTTPConnection, resp: http.client.HTTPResponse) -> None:
        self._conn = conn
        self._resp = resp
        self.status: int = resp.status
        self.headers = resp.headers
        self._body: Optional[bytes] = None

    @property
    def request_id(self) -> Optional[str]:
        return self.headers.get("X-Request-Id")

    def read(self) -> bytes:
        if self._body is None:
            try:
                self._body = self._resp.read()
            except (OSError, http.client.HTTPException) as e:
                raise SheepfoldConnectionError(f"reading the response failed: {e}") from e
            finally:
                self.close()
        return self._body

    def json(self) -> Any:
        body = self.read()
        if not body.strip():
            return None
        try:
            return json.loads(body)
        except ValueError as e:
            raise SheepfoldError(f"the server sent invalid JSON: {body[:200]!r}",
                                 code="ERR_PROTOCOL", status=self.status,
                                 request_id=self.request_id) from e

    def iter_lines(self) -> Iterator[bytes]:
        """Yield the body's lines (without the newline) as they arrive."""
        try:
            while True:
                try:
                    line = self._resp.readline()
                except (OSError, http.client.HTTPException) as e:
                    raise SheepfoldConnectionError(f"the stream broke: {e}") from e
                if not line:
                    return
                line = line.rstrip(b"\r\n")
                if line:
                    yield line
        finally:
            self.close()

    def iter_ndjson(self) -> Iterator[Dict[str, Any]]:
        for line in self.iter_lines():
            try:
                obj = json.loads(line)
            except ValueError as e:
                raise SheepfoldError(f"the server sent an invalid NDJSON line: {line[:200]!r}",
                                     code="ERR_PROTOCOL", status=self.status,
                                     request_id=self.request_id) from e
            if isinstance(obj, dict):
                yield obj

    def close(self) -> None:
        try:
            self._resp.close()
        finally:
            self._conn.close()


class HTTPClient:
    """Talks to one Sheepfold server with one API key. Thread-safe: every
    request uses its own connection."""

    def __init__(
        self,
        api_key: Optional[str] = None,
        base_url: Optional[str] = None,
        request_timeout: Optional[float] = DEFAULT_REQUEST_TIMEOUT,
        max_retries: int = MAX_RETRIES,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        api_key = api_key if api_key is not None else os.environ.get("SHEEPFOLD_API_KEY")
        base_url = base_url or os.environ.get("SHEEPFOLD_URL") or DEFAULT_BASE_URL
        self.api_key: Optional[str] = api_key or None
        self.base_url: str = base_url.rstrip("/")
        parts = urlsplit(self.base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"base_url must be an http(s) URL, not {base_url!r}")
        self._scheme = parts.scheme
        self._host = parts.hostname
        self._port = parts.port
        self._prefix = parts.path.rstrip("/")
        self.request_timeout = request_timeout
        self.max_retries = max_retries
        self._sleep = sleep

    def _connect(self, timeout: Optional[float]) -> http.client.HTTPConnection:
        if self._scheme == "https":
            return http.client.HTTPSConnection(self._host, self._port, timeout=timeout,
                                               context=ssl.create_default_context())
        return http.client.HTTPConnection(self._host, self._port, timeout=timeout)

    def url(self, path: str, params: Params = None) -> str:
        """The request target (path and query) for path."""
        target = self._prefix + path
        if params:
            clean = {k: v for k, v in params.items() if v is not None}
            if clean:
                target += "?" + urlencode(
                    {k: (str(v).lower() if isinstance(v, bool) else v) for k, v in clean.items()})
        return target

    def request(
        self,
        method: str,
        path: str,
        *,
        params: Params = None,
        json_body: Any = None,
        body: Optional[bytes] = None,
        headers: Optional[Mapping[str, str]] = None,
        timeout: Union[float, None, object] = ...,
    ) -> Response:
        """Send a request and return the response if it succeeded (2xx).

        Raises the mapped SheepfoldError for an error response, retrying 429
        (and 503 with Retry-After) up to max_retries times. The body of a
        success is left unread for the caller (read(), json(), iter_ndjson()).
        timeout is the socket timeout in seconds (None: none; default: the
        client's request_timeout).
        """
        hdrs: Dict[str, str] = {
            "User-Agent": f"sheepfold-python/{__version__}",
            "Accept": "application/json",
        }
        if self.api_key:
            hdrs["Authorization"] = f"Bearer {self.api_key}"
        if json_body is not None:
            body = json.dumps(json_body).encode("utf-8")
            hdrs["Content-Type"] = "application/json"
        if headers:
            hdrs.update(headers)
        if body is None and method in ("POST", "PUT", "PATCH"):
            body = b""
        to = self.request_timeout if timeout is ... else timeout
        target = self.url(path, params)

        attempt = 0
        while True:
            # A fresh id per attempt; the server echoes it (X-Request-Id, and
            # request_id in errors) so that a failure can be found in its log.
            hdrs["X-Request-Id"] = "sdk-" + uuid.uuid4().hex[:20]
            resp = self._send(method, target, body, hdrs, to)
            if 200 <= resp.status < 300:
                return resp
            err = self._error(resp)
            retryable = resp.status == 429 or (resp.status == 503 and err.retry_after is not None)
            if not retryable or attempt >= self.max_retries:
                raise err
            wait = err.retry_after if err.retry_after is not None else 0.5 * (2 ** attempt)
            self._sleep(min(wait, MAX_RETRY_WAIT))
            attempt += 1

    def _send(self, method: str, target: str, body: Optional[bytes], headers: Dict[str, str],
              timeout: Optional[float]) -> Response:
        conn = self._connect(timeout)
        try:
            conn.request(method, target, body=body, headers=headers)
            raw = conn.getresponse()
        except socket.timeout as e:
            conn.close()
            raise SheepfoldConnectionError(
                f"{method} {target}: no answer within {timeout} s (request_timeout)") from e
        except (OSError, http.client.HTTPException) as e:
            conn.close()
            raise SheepfoldConnectionError(
                f"{method} {target}: cannot reach the Sheepfold server at {self.base_url}: {e}") from e
        return Response(conn, raw)

    @staticmethod
    def _error(resp: Response) -> SheepfoldError:
        retry_after = parse_retry_after(resp.headers.get("Retry-After"))
        try:
            raw = resp.read()
        except SheepfoldError:
            raw = b""
        code = message = request_id = None
        try:
            doc = json.loads(raw) if raw.strip() else None
        except ValueError:
            doc = None
        if isinstance(doc, dict) and isinstance(doc.get("error"), dict):
            e = doc["error"]
            code, message, request_id = e.get("code"), e.get("message"), e.get("request_id")
        if not message:
            text = raw.decode("utf-8", "replace").strip()[:500]
            message = text or (resp._resp.reason or f"HTTP {resp.status}")
        return error_for(code, message, status=resp.status,
                         request_id=request_id or resp.request_id, retry_after=retry_after)

    # Convenience wrappers.

    def get_json(self, path: str, **kw: Any) -> Any:
        return self.request("GET", path, **kw).json()

    def post_json(self, path: str, body: Any = None, **kw: Any) -> Any:
        return self.request("POST", path, json_body=body if body is not None else {}, **kw).json()

    def delete(self, path: str, **kw: Any) -> None:
        self.request("DELETE", path, **kw).read()

    def stream_ndjson(self, method: str, path: str, *, params: Params = None,
                      **kw: Any) -> Tuple[Response, Iterator[Dict[str, Any]]]:
        """Start an NDJSON stream (?stream=1, Accept: application/x-ndjson).

        A plain JSON body (a server that does not stream) comes back as one
        line, so callers see the same event iterator either way.
        """
        p = dict(params or {})
        p["stream"] = "1"
        resp = self.request(method, path, params=p, headers={"Accept": "application/x-ndjson"}, **kw)
        return resp, resp.iter_ndjson()


def raise_failure(event: Mapping[str, Any]) -> None:
    """Raise the error of a mid-stream ``{"type":"failure","error":{...}}``."""
    e = event.get("error") or {}
    raise error_for(e.get("code"), e.get("message") or "the stream failed",
                    status=None, request_id=e.get("request_id"))
