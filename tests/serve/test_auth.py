"""qpr.serve.auth: the API key, the Host check, and the refusal to serve exposed without one."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from qpr.serve.app import create_app
from qpr.serve.auth import check_exposure, host_allowed, is_loopback, resolve_key
from qpr.serve.settings import ServeSettings, SettingsError
from qpr.serve.sources import LocalSource
from tests.serve.test_app import QIDS, QUESTIONS, SETTINGS, assert_refused, build_bundle

KEY = "k3y-for-tests-0123456789abcdef"


@pytest.fixture(scope="module")
def bundle_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_bundle(tmp_path_factory.mktemp("models"), QUESTIONS, QIDS)


@pytest.fixture(scope="module")
def keyed(bundle_dir: Path) -> Iterator[TestClient]:
    """A service with a key and a Host list, as `qpr serve` on loopback sets it up."""
    settings = SETTINGS.replace(api_key=KEY, allowed_hosts=("localhost", "127.0.0.1", "::1"))
    app = create_app(LocalSource(bundle_dir), settings)
    with TestClient(app, base_url="http://localhost:8000") as client:
        yield client


SEARCH = {"question": QUESTIONS[0], "k": 2}


# ---------------------------------------------------------------- the key


def test_search_without_the_key_is_refused(keyed: TestClient) -> None:
    for path, body in (("/search", SEARCH), ("/search/batch", {"questions": [QUESTIONS[0]]})):
        response = keyed.post(path, json=body)
        assert_refused(response, 401, "unauthorized", "API key is required", "X-API-Key")
        assert response.headers["www-authenticate"] == 'Bearer realm="qpr"'


def _asgi_post(app: Any, headers: list[tuple[bytes, bytes]], size: int) -> tuple[int, int]:
    """POST /search of `size` bytes straight through the ASGI app: (status, how many times
    the app asked for the body)."""
    import asyncio

    asked = 0
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        nonlocal asked
        asked += 1
        return {"type": "http.request", "body": b"{" * size, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/search",
        "raw_path": b"/search",
        "query_string": b"",
        "root_path": "",
        "server": ("localhost", 8000),
        "client": ("127.0.0.1", 5000),
        "headers": [
            (b"host", b"localhost"),
            (b"content-type", b"application/json"),
            (b"content-length", str(size).encode()),
            *headers,
        ],
    }
    asyncio.run(app(scope, receive, send))
    return sent[0]["status"], asked


def test_the_key_is_checked_before_the_body_is_read(keyed: TestClient) -> None:
    for headers in ([], [(b"x-api-key", b"wrong-key-0123456789abcdef")]):
        for size in (1000, SETTINGS.max_body_bytes):
            assert _asgi_post(keyed.app, headers, size) == (401, 0)
    # With the key, the body is read (and refused: 1,000 "{" are no search).
    assert _asgi_post(keyed.app, [(b"x-api-key", KEY.encode())], 1000) == (400, 1)


def test_a_keyless_client_is_refused_before_it_sends_its_body(bundle_dir: Path) -> None:
    """Over a real socket: the head alone gets its 401, long before the body timeout."""
    from tests.serve.test_connections import held, read_all, serving

    settings = SETTINGS.replace(api_key=KEY, body_timeout=60)
    with serving(bundle_dir, settings) as (url, _):
        sock = held(
            url,
            b"POST /search HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            b"Content-Length: 200000\r\nConnection: close\r\n\r\n",
        )
        assert read_all(sock).startswith(b"HTTP/1.1 401 ")  # held() times out after 10 s
        sock.close()


@pytest.mark.parametrize(
    "headers",
    [
        {"Authorization": f"Bearer {KEY}"},
        {"Authorization": f"bearer  {KEY} "},  # the scheme is case-insensitive
        {"X-API-Key": KEY},
        {"Authorization": "Bearer wrong-key-wrong-key", "X-API-Key": KEY},  # either may hold it
    ],
)
def test_either_header_opens(keyed: TestClient, headers: dict[str, str]) -> None:
    response = keyed.post("/search", json=SEARCH, headers=headers)
    assert response.status_code == 200, response.text
    assert response.json()["hits"][0]["question_id"] == str(QIDS[0])
    batch = keyed.post("/search/batch", json={"questions": [QUESTIONS[1]]}, headers=headers)
    assert batch.status_code == 200, batch.text


@pytest.mark.parametrize(
    "headers",
    [
        {"Authorization": "Bearer not-the-key-at-all"},
        {"Authorization": f"Basic {KEY}"},
        {"Authorization": KEY},
        {"X-API-Key": KEY[:-1]},
        {"X-API-Key": KEY + "x"},
        {"X-API-Key": "é-not-ascii".encode()},
    ],
)
def test_a_wrong_key_is_refused(keyed: TestClient, headers: dict[str, Any]) -> None:
    response = keyed.post("/search", json=SEARCH, headers=headers)
    body = assert_refused(response, 401, "unauthorized", "not valid")
    assert KEY not in json.dumps(body)
    assert response.headers["www-authenticate"] == 'Bearer realm="qpr", error="invalid_token"'


@pytest.mark.parametrize("path", ["/version", "/metrics", "/openapi.json", "/nowhere"])
def test_internals_need_the_key(keyed: TestClient, path: str) -> None:
    assert_refused(keyed.get(path), 401, "unauthorized")
    opened = keyed.get(path, headers={"X-API-Key": KEY})
    assert opened.status_code == (404 if path == "/nowhere" else 200)


def test_probes_stay_open_but_readyz_details_need_the_key(keyed: TestClient) -> None:
    assert keyed.get("/healthz").json() == {"status": "ok"}
    bare = keyed.get("/readyz")
    assert bare.status_code == 200 and bare.json() == {"status": "ready"}
    full = keyed.get("/readyz", headers={"Authorization": f"Bearer {KEY}"})
    assert full.status_code == 200 and full.json()["model"]["name"] == "local"


def test_readyz_hides_the_reason_without_the_key(tmp_path: Path) -> None:
    app = create_app(LocalSource(tmp_path / "missing"), SETTINGS.replace(api_key=KEY))
    with TestClient(app) as client:
        bare = client.get("/readyz")
        assert bare.status_code == 503 and bare.json() == {"status": "not ready"}
        full = client.get("/readyz", headers={"X-API-Key": KEY})
        assert full.status_code == 503 and full.json()["reason"]
        assert str(tmp_path) not in full.text  # no absolute path either


def test_refusals_are_counted(keyed: TestClient) -> None:
    keyed.post("/search", json=SEARCH)
    text = keyed.get("/metrics", headers={"X-API-Key": KEY}).text
    assert 'qpr_http_requests_total{endpoint="/search",method="POST",status="401"}' in text


def test_without_a_key_everything_is_open(bundle_dir: Path) -> None:
    with TestClient(create_app(LocalSource(bundle_dir), SETTINGS)) as client:
        assert client.post("/search", json=SEARCH).status_code == 200
        assert client.get("/version").status_code == 200
        assert client.get("/readyz").json()["model"]["name"] == "local"


# ---------------------------------------------------------------- where the key comes from


def write_key(path: Path, text: str, mode: int = 0o600) -> Path:
    path.write_text(text, encoding="utf-8")
    path.chmod(mode)
    return path


def test_the_key_file_is_read_and_stripped(tmp_path: Path) -> None:
    path = write_key(tmp_path / "key", f"  {KEY}\n")
    assert resolve_key(ServeSettings(api_key_file=str(path))) == KEY
    assert resolve_key(ServeSettings(api_key=f" {KEY} ")) == KEY
    assert resolve_key(ServeSettings()) is None


@pytest.mark.parametrize(
    ("settings", "words"),
    [
        (ServeSettings(api_key_file="/nonexistent/key"), "cannot read it"),
        (ServeSettings(api_key="short"), "at least 16"),
        (ServeSettings(api_key="has a space in the middle"), "printable ASCII"),
        (ServeSettings(api_key="   "), "QPR_SERVE_API_KEY: the key is empty"),
        (ServeSettings(auth=True), "QPR_SERVE_AUTH=on needs a key"),
    ],
)
def test_unusable_keys_stop_the_start(settings: ServeSettings, words: str) -> None:
    with pytest.raises(SettingsError, match=words):
        resolve_key(settings)


def test_an_empty_or_unreadable_key_file_is_named(tmp_path: Path) -> None:
    empty = write_key(tmp_path / "empty", "\n \n")
    with pytest.raises(SettingsError, match=f"QPR_SERVE_API_KEY_FILE={empty}: the file is empty"):
        resolve_key(ServeSettings(api_key_file=str(empty)))
    with pytest.raises(SettingsError, match="cannot read it"):
        resolve_key(ServeSettings(api_key_file=str(tmp_path)))  # a directory
    with pytest.raises(SettingsError, match="cannot read it"):
        create_app(LocalSource(tmp_path), ServeSettings(api_key_file=str(tmp_path / "none")))


@pytest.mark.parametrize("mode", [0o644, 0o604, 0o602, 0o666])
def test_a_key_file_other_users_can_read_or_write_is_refused(tmp_path: Path, mode: int) -> None:
    path = write_key(tmp_path / "key", KEY, mode)
    with pytest.raises(SettingsError) as caught:
        resolve_key(ServeSettings(api_key_file=str(path)))
    message = str(caught.value)
    assert "\n" not in message and KEY not in message
    assert f"mode {mode:04o}" in message and "chmod" in message and str(path) in message


@pytest.mark.parametrize("mode", [0o600, 0o400, 0o640, 0o440])
def test_a_key_file_for_its_owner_or_group_is_accepted(tmp_path: Path, mode: int) -> None:
    path = write_key(tmp_path / "key", KEY, mode)
    assert resolve_key(ServeSettings(api_key_file=str(path))) == KEY


def test_serve_refuses_a_world_readable_key_file_in_one_line(
    monkeypatch: pytest.MonkeyPatch, bundle_dir: Path, tmp_path: Path
) -> None:
    write_key(tmp_path / "key", KEY, 0o644)
    monkeypatch.setenv("QPR_SERVE_API_KEY_FILE", str(tmp_path / "key"))
    result, started = _serve(monkeypatch, "--models-dir", str(bundle_dir))
    assert result.exit_code == 1 and not started
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "every user may read" in lines[0], result.output


def test_the_key_is_never_shown(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("QPR_SERVE_API_KEY", KEY)
    settings = ServeSettings.from_env()
    assert settings.api_key == KEY and KEY not in repr(settings)
    monkeypatch.setenv("QPR_SERVE_API_KEY_FILE", str(tmp_path / "key"))
    with pytest.raises(SettingsError, match="not both") as caught:
        ServeSettings.from_env()
    assert KEY not in str(caught.value)


@pytest.mark.parametrize(
    ("variables", "expected"),
    [
        ({"QPR_SERVE_AUTH": "off"}, {"auth": False}),
        ({"QPR_SERVE_AUTH": "on"}, {"auth": True}),
        (
            {"QPR_SERVE_ALLOWED_HOSTS": " API.example.com, [::1] ,*.corp"},
            {"allowed_hosts": ("api.example.com", "::1", "*.corp")},
        ),
    ],
)
def test_auth_variables_are_parsed(
    monkeypatch: pytest.MonkeyPatch, variables: dict[str, str], expected: dict[str, Any]
) -> None:
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    settings = ServeSettings.from_env()
    assert {name: getattr(settings, name) for name in expected} == expected


@pytest.mark.parametrize(
    ("variables", "words"),
    [
        ({"QPR_SERVE_AUTH": "maybe"}, "QPR_SERVE_AUTH='maybe' is not a valid on/off"),
        ({"QPR_SERVE_AUTH": "off", "QPR_SERVE_API_KEY": KEY}, "drop one"),
        ({"QPR_SERVE_ALLOWED_HOSTS": ",,"}, "QPR_SERVE_ALLOWED_HOSTS"),
        ({"QPR_SERVE_ALLOWED_HOSTS": "http://x/"}, "QPR_SERVE_ALLOWED_HOSTS"),
        ({"QPR_SERVE_ALLOWED_HOSTS": "api.example.com:443"}, "QPR_SERVE_ALLOWED_HOSTS"),
    ],
)
def test_bad_auth_variables_are_refused(
    monkeypatch: pytest.MonkeyPatch, variables: dict[str, str], words: str
) -> None:
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SettingsError, match=words) as caught:
        ServeSettings.from_env()
    assert KEY not in str(caught.value)


# ---------------------------------------------------------------- the Host check


@pytest.mark.parametrize(
    ("host", "allowed", "ok"),
    [
        ("localhost:8000", ("localhost",), True),
        ("LOCALHOST", ("localhost",), True),
        ("127.0.0.1:80", ("127.0.0.1",), True),
        ("[::1]:8000", ("::1",), True),
        ("[::1]", ("::1",), True),
        ("evil.example", ("localhost", "127.0.0.1"), False),
        ("localhost.evil.example", ("localhost",), False),
        ("", ("localhost",), False),
        ("api.example.com", ("*.example.com",), True),
        ("example.com", ("*.example.com",), False),
        ("anything:1", ("*",), True),
    ],
)
def test_host_allowed(host: str, allowed: tuple[str, ...], ok: bool) -> None:
    assert host_allowed(host, allowed) is ok


def test_a_bad_host_gets_400(keyed: TestClient) -> None:
    key = {"X-API-Key": KEY}
    for host in ("evil.example", "localhost.evil.example:8000", "127.0.0.2"):
        response = keyed.post("/search", json=SEARCH, headers={**key, "Host": host})
        assert_refused(response, 400, "invalid_host", repr(host))
        assert_refused(keyed.get("/version", headers={**key, "Host": host}), 400, "invalid_host")
    for host in ("127.0.0.1:8000", "[::1]:8000", "localhost"):
        response = keyed.post("/search", json=SEARCH, headers={**key, "Host": host})
        assert response.status_code == 200, (host, response.text)


def test_probes_skip_the_host_check(keyed: TestClient) -> None:
    # Orchestrators probe by the pod's address, which is no allowed name.
    assert keyed.get("/healthz", headers={"Host": "10.1.2.3:8000"}).status_code == 200
    assert keyed.get("/readyz", headers={"Host": "10.1.2.3:8000"}).status_code == 200


# ---------------------------------------------------------------- exposure (qpr serve)


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.0.0.2", True),
        ("localhost", True),
        ("::1", True),
        ("[::1]", True),
        ("0.0.0.0", False),
        ("::", False),
        ("192.168.1.20", False),
        ("myhost.lan", False),
    ],
)
def test_is_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_loopback_serves_without_a_key_and_checks_hosts() -> None:
    settings = check_exposure(ServeSettings(), "127.0.0.1")
    assert settings.auth is None and settings.allowed_hosts == ("localhost", "127.0.0.1", "::1")
    assert check_exposure(ServeSettings(), "127.0.0.2").allowed_hosts[-1] == "127.0.0.2"
    given = ServeSettings(allowed_hosts=("search.local",))
    assert check_exposure(given, "127.0.0.1").allowed_hosts == ("search.local",)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.20", "myhost.lan"])
def test_exposed_without_a_key_is_refused(host: str) -> None:
    with pytest.raises(SettingsError, match=f"refusing to serve on {host} without an API key"):
        check_exposure(ServeSettings(), host)


def test_exposed_with_a_key_or_auth_off_is_allowed() -> None:
    keyed = check_exposure(ServeSettings(api_key=KEY), "0.0.0.0")
    assert keyed.allowed_hosts == ("*",)
    assert check_exposure(ServeSettings(auth=False), "0.0.0.0").auth is False
    flagged = check_exposure(ServeSettings(), "::", insecure_no_auth=True)
    assert flagged.auth is False and flagged.allowed_hosts == ("*",)
    with pytest.raises(SettingsError, match="drop one"):
        check_exposure(ServeSettings(api_key=KEY), "0.0.0.0", insecure_no_auth=True)


def _serve(monkeypatch: pytest.MonkeyPatch, *args: str) -> tuple[Any, dict[str, Any]]:
    """`qpr serve ARGS` with the server's run replaced: the exit, and what it would run."""
    from typer.testing import CliRunner

    from qpr.cli import app
    from qpr.serve import connections

    started: dict[str, Any] = {}
    monkeypatch.setattr(connections, "serve", lambda asgi, **kw: started.update(app=asgi, **kw))
    return CliRunner().invoke(app, ["serve", *args]), started


def test_serve_refuses_an_exposed_host_without_a_key(
    monkeypatch: pytest.MonkeyPatch, bundle_dir: Path
) -> None:
    monkeypatch.delenv("QPR_SERVE_API_KEY", raising=False)
    monkeypatch.delenv("QPR_SERVE_API_KEY_FILE", raising=False)
    monkeypatch.delenv("QPR_SERVE_AUTH", raising=False)
    result, started = _serve(monkeypatch, "--models-dir", str(bundle_dir), "--host", "0.0.0.0")
    assert result.exit_code == 1 and not started
    assert "refusing to serve on 0.0.0.0" in result.output
    assert "--insecure-no-auth" in result.output


@pytest.mark.parametrize("how", ["flag", "variable"])
def test_serve_exposed_with_auth_explicitly_off(
    monkeypatch: pytest.MonkeyPatch, bundle_dir: Path, how: str
) -> None:
    args = ["--models-dir", str(bundle_dir), "--host", "0.0.0.0"]
    if how == "flag":
        args.append("--insecure-no-auth")
    else:
        monkeypatch.setenv("QPR_SERVE_AUTH", "off")
    monkeypatch.setenv("QPR_SERVE_POLL_SECONDS", "0")
    monkeypatch.setenv("QPR_SERVE_STARTUP_WAIT", "60")  # the first model loads before serving
    result, started = _serve(monkeypatch, *args)
    assert result.exit_code == 0, result.output
    assert started["host"] == "0.0.0.0"
    with TestClient(started["app"], base_url="http://203.0.113.7:8000") as client:
        assert client.post("/search", json=SEARCH).status_code == 200


def test_serve_exposed_with_a_key_file(
    monkeypatch: pytest.MonkeyPatch, bundle_dir: Path, tmp_path: Path
) -> None:
    write_key(tmp_path / "key", KEY + "\n")
    monkeypatch.setenv("QPR_SERVE_API_KEY_FILE", str(tmp_path / "key"))
    monkeypatch.setenv("QPR_SERVE_POLL_SECONDS", "0")
    monkeypatch.setenv("QPR_SERVE_STARTUP_WAIT", "60")  # the first model loads before serving
    result, started = _serve(monkeypatch, "--models-dir", str(bundle_dir), "--host", "::")
    assert result.exit_code == 0, result.output
    with TestClient(started["app"], base_url="http://search.example") as client:
        assert client.post("/search", json=SEARCH).status_code == 401
        ok = client.post("/search", json=SEARCH, headers={"Authorization": f"Bearer {KEY}"})
        assert ok.status_code == 200


def test_serve_on_loopback_checks_the_host(
    monkeypatch: pytest.MonkeyPatch, bundle_dir: Path
) -> None:
    monkeypatch.setenv("QPR_SERVE_POLL_SECONDS", "0")
    monkeypatch.setenv("QPR_SERVE_STARTUP_WAIT", "60")  # the first model loads before serving
    result, started = _serve(monkeypatch, "--models-dir", str(bundle_dir))
    assert result.exit_code == 0, result.output
    with TestClient(started["app"], base_url="http://127.0.0.1:8000") as client:
        assert client.post("/search", json=SEARCH).status_code == 200
        rebound = client.post("/search", json=SEARCH, headers={"Host": "attacker.example"})
        assert_refused(rebound, 400, "invalid_host")
