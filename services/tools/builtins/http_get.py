"""``http_get``: fetch a URL whose host is in ``LW_HTTP_ALLOW`` (default: loopback only).

The host is checked before any connection is made, and again for every redirect; proxies from the
environment are ignored (the connection goes straight to the allowed host). The body is cut at
:data:`MAX_BODY_BYTES`. Runs in a worker thread (urllib; no extra dependency).
"""

from __future__ import annotations

import urllib.error
import urllib.request
from typing import Any, Final
from urllib.parse import urlsplit

import msgspec

from services.tools.sdk import ToolContext, ToolError, ToolOutput, tool

MAX_BODY_BYTES: Final = 64 * 1024
MAX_TIMEOUT_SECONDS: Final = 30.0
MAX_URL_CHARS: Final = 8192


class HttpGetInput(msgspec.Struct, forbid_unknown_fields=True):
    """An http(s) URL on an allowed host."""

    url: str


def check_url(url: str, allow: tuple[str, ...]) -> str:
    """The URL's host if the URL may be fetched, else a ToolError (no connection is made)."""
    if len(url) > MAX_URL_CHARS or any(c in url for c in "\r\n\x00"):
        raise ToolError("invalid URL")
    try:
        parts = urlsplit(url)
        host = (parts.hostname or "").lower()
        _ = parts.port  # raises ValueError for a bad port
    except ValueError as e:
        raise ToolError(f"invalid URL: {e}") from None
    if parts.scheme not in ("http", "https"):
        raise ToolError("only http and https URLs are allowed")
    if not host:
        raise ToolError("the URL has no host")
    allowed = {h.lower().strip("[]") for h in allow}
    if host not in allowed:
        raise ToolError(f"host {host!r} is not allowed (LW_HTTP_ALLOW: {', '.join(sorted(allowed)) or 'none'})")
    return host


class _CheckedRedirects(urllib.request.HTTPRedirectHandler):
    def __init__(self, allow: tuple[str, ...]) -> None:
        self.allow = allow

    def redirect_request(self, req: Any, fp: Any, code: int, msg: str, headers: Any, newurl: str) -> Any:
        check_url(newurl, self.allow)  # a redirect to another host is refused like a direct request
        return super().redirect_request(req, fp, code, msg, headers, newurl)


@tool(
    name="http_get",
    description="HTTP GET a URL on an allowed host and return status, content type and body.",
    read_only=True,
    open_world=True,
)
def http_get(args: HttpGetInput, ctx: ToolContext) -> ToolOutput:
    allow = ctx.settings.http_allow
    check_url(args.url, allow)
    remaining = ctx.remaining()
    timeout = MAX_TIMEOUT_SECONDS if remaining is None else max(0.1, min(MAX_TIMEOUT_SECONDS, remaining))
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), _CheckedRedirects(allow))
    request = urllib.request.Request(args.url, method="GET", headers={"User-Agent": "loopwire-http_get"})
    try:
        with opener.open(request, timeout=timeout) as resp:
            status, reason = resp.status, resp.reason
            ctype = resp.headers.get("Content-Type", "")
            body = resp.read(MAX_BODY_BYTES + 1)
    except urllib.error.HTTPError as e:
        status, reason = e.code, e.reason
        ctype = e.headers.get("Content-Type", "") if e.headers else ""
        body = e.read(MAX_BODY_BYTES + 1) if e.fp else b""
    except (urllib.error.URLError, OSError, ValueError) as e:
        reason_text = getattr(e, "reason", e)
        raise ToolError(f"request failed: {reason_text}") from None
    text = body[:MAX_BODY_BYTES].decode("utf-8", "replace")
    if len(body) > MAX_BODY_BYTES:
        text += f"\n[body truncated at {MAX_BODY_BYTES} bytes]"
    return ToolOutput(f"HTTP {status} {reason}\ncontent-type: {ctype}\n\n{text}", is_error=status >= 400)
