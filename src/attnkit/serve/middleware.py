"""The ASGI guard in front of every request: metrics (count and latency by endpoint and status), the API key,
the body's size limit (413) and time limit (408: a client that trickles its body cannot hold a connection for
ever), and a last one-line 500 for anything that escaped the app's handlers."""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time

from starlette.exceptions import HTTPException

log = logging.getLogger("attnkit.serve")

# the paths every server answers; an app adds its input kinds' upload endpoints (attnkit.serve.app)
ENDPOINTS = frozenset({"/health", "/metrics", "/docs", "/openapi.json", "/v1/models", "/v1/translate",
                       "/v1/generate", "/v1/attention", "/v1/score", "/v1/positional", "/v1/classify"})


class BodyTooLarge(HTTPException):
    """Raised while a body is read past the limit (FastAPI passes HTTP exceptions through its body parsing)."""

    def __init__(self, limit: int):
        super().__init__(413, f"body: more than this server's limit of {limit} bytes")


class BodyTooSlow(HTTPException):
    """Raised when a body has not arrived whole within the server's body timeout."""

    def __init__(self, seconds: float):
        super().__init__(408, f"body: not received within {seconds:g} s")


def endpoint_of(path: str, endpoints=ENDPOINTS) -> str:
    """A metrics label with few values: the API's paths as they are, everything else as static or other."""
    if path in endpoints:
        return path
    if path.startswith("/v1/"):
        return "other"
    return "static"


class GuardMiddleware:
    """``endpoints``: the app's paths (metrics labels); ``limits``: {path: the most bytes its body may have} where
    that is not a JSON body's limit (the uploads: their files' limits and room for the form's other fields)."""

    def __init__(self, app, settings, metrics, endpoints=ENDPOINTS, limits: dict | None = None):
        self.app, self.settings, self.metrics = app, settings, metrics
        self.endpoints, self.limits = endpoints, limits or {}

    def _limit(self, path: str) -> int:
        if path in self.limits:
            return self.limits[path]
        if path == "/v1/attention":
            return self.settings.max_body_bytes + self.settings.max_image_bytes * 4 // 3 + 1024  # base64
        return self.settings.max_body_bytes

    def _authorized(self, headers: dict[bytes, bytes]) -> bool:
        key = self.settings.api_key.encode()
        given = headers.get(b"x-api-key")
        if given is None:
            auth = headers.get(b"authorization", b"")
            if auth[:7].lower() == b"bearer ":
                given = auth[7:].strip()
        return given is not None and hmac.compare_digest(given, key)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start, path = time.perf_counter(), scope.get("path", "")
        endpoint = endpoint_of(path, self.endpoints)
        state = {"status": 0, "started": False, "recorded": False}

        def record(status: int) -> None:
            if not state["recorded"]:
                state["recorded"] = True
                self.metrics.request(endpoint, status, time.perf_counter() - start)

        async def guarded_send(message):
            if message["type"] == "http.response.start":
                state["status"], state["started"] = message["status"], True
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                record(state["status"])

        async def answer(status: int, error: str, headers: list | None = None):
            body = json.dumps({"error": error}).encode()
            await guarded_send({"type": "http.response.start", "status": status,
                                "headers": [(b"content-type", b"application/json"),
                                            (b"content-length", str(len(body)).encode()), *(headers or [])]})
            await guarded_send({"type": "http.response.body", "body": body})

        headers = dict(scope.get("headers") or [])
        if self.settings.api_key and (path.startswith("/v1/") or path == "/metrics") and \
                not self._authorized(headers):
            return await answer(401, "authorization: missing or wrong API key (send the header "
                                     "'Authorization: Bearer KEY' or 'X-API-Key: KEY')",
                                [(b"www-authenticate", b"Bearer")])
        limit = self._limit(path)
        length = headers.get(b"content-length")
        if length is not None:
            try:
                too_long = int(length) > limit
            except ValueError:
                return await answer(400, "content-length: not a number")
            if too_long:
                return await answer(413, f"body: {int(length)} bytes, more than this server's limit of {limit}")
        seen, body_done = 0, False
        body_deadline = time.monotonic() + self.settings.body_timeout

        async def limited_receive():
            """The body, counted against the size limit and timed against the body timeout; once it is whole,
            the next message (a disconnect) is awaited without limit."""
            nonlocal seen, body_done
            if body_done:
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), max(body_deadline - time.monotonic(), 0.0))
            except asyncio.TimeoutError:
                raise BodyTooSlow(self.settings.body_timeout) from None
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise BodyTooLarge(limit)
                body_done = not message.get("more_body", False)
            else:
                body_done = True
            return message

        try:
            await self.app(scope, limited_receive, guarded_send)
        except Exception:  # noqa: BLE001 - the last line of defence: one line, never a traceback
            log.exception("unhandled error on %s %s", scope.get("method"), path)
            if not state["started"]:
                await answer(500, "internal: the server failed on this request (see its log)")
            else:
                record(state["status"] or 500)
        finally:
            if not state["recorded"] and state["started"]:
                record(state["status"])  # a stream its client left
