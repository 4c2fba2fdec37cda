"""Who may call the service: an optional API key, a Host check, and the exposure rule.

- API key (`QPR_SERVE_API_KEY`, or a file named by `QPR_SERVE_API_KEY_FILE` that other
  users can neither read nor write): when set,
  every path except `OPEN_PATHS` needs ``Authorization: Bearer <key>`` or
  ``X-API-Key: <key>``; else 401 with ``WWW-Authenticate: Bearer``. /readyz stays open
  for probes but shows its details (model, reason) only with the key.
- Host check (`QPR_SERVE_ALLOWED_HOSTS`): a request whose Host header names none of the
  allowed hosts gets 400. It stops DNS rebinding: a web page whose name resolves to
  127.0.0.1 cannot drive a loopback service from a browser. The probes' paths are exempt,
  since orchestrators probe by IP address.
- Exposure (`check_exposure`, run by ``qpr serve``): a non-loopback address without a key
  is refused unless auth is switched off explicitly (``--insecure-no-auth`` or
  ``QPR_SERVE_AUTH=off``).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
import re
import stat
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any

from qpr.serve.settings import ServeSettings, SettingsError

__all__ = [
    "LOOPBACK_HOSTS",
    "MIN_KEY_CHARS",
    "OPEN_PATHS",
    "AccessControl",
    "check_exposure",
    "host_allowed",
    "is_loopback",
    "resolve_key",
]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
# (error code, message, request id) -> the service's JSON error body
RenderError = Callable[[str, str, str], bytes]

# Liveness and readiness: load balancers and orchestrators call them without credentials.
OPEN_PATHS = frozenset({"/healthz", "/readyz"})
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")
# A shorter key could be guessed by trying; 16 random characters cannot.
MIN_KEY_CHARS = 16
# Printable ASCII without spaces: what a header carries unchanged.
_KEY_CHARS = re.compile(r"[\x21-\x7e]+")
_BEARER = re.compile(rb"\s*bearer\s+(\S+)\s*", re.IGNORECASE)
# A key file other users may read or write is refused (resolve_key).
_OTHERS = stat.S_IROTH | stat.S_IWOTH


def resolve_key(settings: ServeSettings) -> str | None:
    """The API key in force, or None when requests need none. SettingsError when it is
    required but missing, or when the key or its file is unusable."""
    if settings.api_key_file is not None:
        where = f"QPR_SERVE_API_KEY_FILE={settings.api_key_file}"
        try:
            with Path(settings.api_key_file).open("rb") as handle:
                mode = os.fstat(handle.fileno()).st_mode
                raw = handle.read()
        except OSError as exc:
            raise SettingsError(f"{where}: cannot read it ({exc.strerror or exc})") from None
        if mode & _OTHERS:
            # As ssh does with a private key: a key every local user can read (or replace)
            # guards nothing. Group access stays allowed, for a container's group.
            raise SettingsError(
                f"{where}: every user may read or write it (mode {stat.S_IMODE(mode):04o}); "
                "run chmod o-rwx on it (e.g. chmod 600, or 640 for a group)"
            )
        try:
            key = raw.decode("utf-8").strip()
        except UnicodeDecodeError:
            raise SettingsError(f"{where}: not UTF-8 text") from None
        if not key:
            raise SettingsError(f"{where}: the file is empty")
    elif settings.api_key is not None:
        where, key = "QPR_SERVE_API_KEY", settings.api_key.strip()
    else:
        if settings.auth:
            raise SettingsError(
                "QPR_SERVE_AUTH=on needs a key: set QPR_SERVE_API_KEY_FILE or QPR_SERVE_API_KEY"
            )
        return None
    # The messages below never quote the key: they end up in logs.
    if not key:
        raise SettingsError(f"{where}: the key is empty")
    if not _KEY_CHARS.fullmatch(key):
        raise SettingsError(f"{where}: the key must be printable ASCII without spaces")
    if len(key) < MIN_KEY_CHARS:
        raise SettingsError(
            f"{where}: the key has {len(key)} characters; use at least {MIN_KEY_CHARS} "
            "(e.g. python -c 'import secrets; print(secrets.token_urlsafe(32))')"
        )
    return key


def is_loopback(host: str) -> bool:
    """True for localhost and loopback addresses; any other name may reach the network."""
    name = host.strip().strip("[]").lower()
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def check_exposure(
    settings: ServeSettings, host: str, *, insecure_no_auth: bool = False
) -> ServeSettings:
    """The settings for listening on `host`: the default allowed hosts filled in, auth off
    when asked. SettingsError when a non-loopback address would serve without a key."""
    if insecure_no_auth:
        if settings.api_key is not None or settings.api_key_file is not None:
            raise SettingsError("--insecure-no-auth but an API key is set: drop one of them")
        settings = settings.replace(auth=False)
    key = resolve_key(settings)
    loopback = is_loopback(host)
    if key is None and not loopback and settings.auth is not False:
        raise SettingsError(
            f"refusing to serve on {host} without an API key: anyone who reaches it could "
            "search and read /version. Set QPR_SERVE_API_KEY_FILE (or QPR_SERVE_API_KEY), "
            "or pass --insecure-no-auth (QPR_SERVE_AUTH=off) when something in front "
            "authenticates"
        )
    if settings.allowed_hosts is None:
        # On loopback only local names can be right; elsewhere the public name is unknown.
        names = (*LOOPBACK_HOSTS, host.strip("[]").lower()) if loopback else ("*",)
        settings = settings.replace(allowed_hosts=tuple(dict.fromkeys(names)))
    return settings


def _host_name(header: str) -> str:
    """The Host header without its port, lower case, IPv6 brackets removed."""
    value = header.strip().lower()
    if value.startswith("["):
        return value[1 : value.find("]")] if "]" in value else value
    name, colon, port = value.rpartition(":")
    return name if colon and port.isdigit() and ":" not in name else value


def host_allowed(header: str, allowed: tuple[str, ...]) -> bool:
    """Whether a Host header names an allowed host (``*`` any, ``*.example.com`` any
    subdomain)."""
    name = _host_name(header)
    if not name:
        return False
    for pattern in allowed:
        if pattern == "*" or name == pattern:
            return True
        if pattern.startswith("*.") and name.endswith(pattern[1:]):
            return True
    return False


class AccessControl:
    """ASGI middleware: the Host check, then the API key (see the module docstring).

    Marks ``scope["state"]["authenticated"]`` for the endpoints (/readyz) that show more
    to a caller with the key. Refusals are rendered by the service's `render`.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        key: str | None,
        allowed_hosts: tuple[str, ...] | None,
        render: RenderError,
    ) -> None:
        self.app = app
        # Compared as digests: equal lengths, so compare_digest leaks not even the length.
        self._digest = None if key is None else hashlib.sha256(key.encode("ascii")).digest()
        self.allowed_hosts = (
            None if allowed_hosts is None or "*" in allowed_hosts else allowed_hosts
        )
        self.render = render

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        state = scope.setdefault("state", {})
        path = scope.get("path", "")
        headers: dict[bytes, bytes] = {}
        for name, value in scope.get("headers", []):
            headers.setdefault(name.lower(), value)
        if self.allowed_hosts is not None and path not in OPEN_PATHS:
            host = headers.get(b"host", b"").decode("latin-1")
            if not host_allowed(host, self.allowed_hosts):
                shown = host[:100] or "none"
                await self._refuse(
                    send, state, 400, "invalid_host", f"Host {shown!r} is not served"
                )
                return
        state["authenticated"] = self._digest is None or self._authenticated(headers)
        if not state["authenticated"] and path not in OPEN_PATHS:
            given = b"authorization" in headers or b"x-api-key" in headers
            message = (
                "the API key is not valid"
                if given
                else "an API key is required: send Authorization: Bearer <key> or X-API-Key"
            )
            challenge = b'Bearer realm="qpr"' + (b', error="invalid_token"' if given else b"")
            await self._refuse(send, state, 401, "unauthorized", message, challenge)
            return
        await self.app(scope, receive, send)

    def _authenticated(self, headers: dict[bytes, bytes]) -> bool:
        offered = []
        bearer = _BEARER.fullmatch(headers.get(b"authorization", b""))
        if bearer:
            offered.append(bearer.group(1))
        if b"x-api-key" in headers:
            offered.append(headers[b"x-api-key"].strip())
        # Every offer is compared (no early exit), so timing does not say which one failed.
        matches = [hmac.compare_digest(hashlib.sha256(o).digest(), self._digest) for o in offered]
        return any(matches)

    async def _refuse(
        self,
        send: Send,
        state: MutableMapping[str, Any],
        status: int,
        code: str,
        message: str,
        challenge: bytes | None = None,
    ) -> None:
        body = self.render(code, message, str(state.get("request_id", "-")))
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ]
        if challenge is not None:
            headers.append((b"www-authenticate", challenge))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
