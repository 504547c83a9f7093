"""`--model ORG/NAME` fetched from a Hub: a local HTTP server on 127.0.0.1 stands in for it (HF_ENDPOINT), never
the internet. It serves what hf_hub_download asks for: HEAD and GET /{org}/{name}/resolve/{rev}/config.json with
the ETag and X-Repo-Commit headers, and 401 + X-Error-Code (GatedRepo / RepoNotFound) the way the Hub refuses.
The CLI runs in subprocesses so that each sees exactly the environment given (huggingface_hub reads
HF_HUB_OFFLINE when imported), each with a timeout."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from test_catalog import TINY as CATALOG_TINY
from test_catalog import TINY_PARAMS

from estimator.model import hub

pytest.importorskip("huggingface_hub")

ROOT = Path(__file__).resolve().parents[2]
TINY = {"architectures": ["LlamaForCausalLM"], **CATALOG_TINY}  # as a Hub config.json names its class
BODY = json.dumps(TINY, indent=2).encode()
COMMIT = "0123456789abcdef0123456789abcdef01234567"
TOKEN = "hf_test_token_for_the_gated_repo"
MAX_REQUESTS = 40  # every test together; a retry loop would blow past this


class FakeHub(BaseHTTPRequestHandler):
    """acme/tiny-lm (public), acme/gated-lm (needs TOKEN), anything else: RepoNotFound."""

    requests: list[str] = []

    def log_message(self, *args):  # keep pytest output clean
        pass

    def do_HEAD(self):
        self._answer(body=False)

    def do_GET(self):
        self._answer(body=True)

    def _answer(self, body: bool):
        FakeHub.requests.append(f"{self.command} {self.path}")
        parts = self.path.split("?", 1)[0].strip("/").split("/")
        if len(parts) != 5 or parts[2] != "resolve" or parts[4] != "config.json":
            return self._refuse(404, "EntryNotFound", "Entry not found")
        repo, rev = "/".join(parts[:2]), parts[3]
        if repo == "acme/gated-lm" and self.headers.get("authorization") != f"Bearer {TOKEN}":
            return self._refuse(401, "GatedRepo", f"Access to model {repo} is restricted.")
        if repo not in ("acme/tiny-lm", "acme/gated-lm"):
            return self._refuse(401, "RepoNotFound", "Repository not found")
        if rev not in ("main", "v1", COMMIT):
            return self._refuse(404, "RevisionNotFound", "Invalid rev id")
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(BODY)))
        self.send_header("ETag", f'"{hashlib.sha1(BODY).hexdigest()}"')
        self.send_header("X-Repo-Commit", COMMIT)
        self.end_headers()
        if body:
            self.wfile.write(BODY)

    def _refuse(self, status: int, code: str, message: str):
        data = json.dumps({"error": message}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("X-Error-Code", code)
        self.send_header("X-Error-Message", message)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)


@pytest.fixture(scope="module")
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), FakeHub)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()
    assert len(FakeHub.requests) <= MAX_REQUESTS, FakeHub.requests


def env_for(tmp_path: Path, endpoint: str | None, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_", "TRANSFORMERS_"))}
    env.update(
        PYTHONPATH=str(ROOT),
        HOME=str(tmp_path / "home"),  # no stored token from the developer's machine
        XDG_CACHE_HOME=str(tmp_path / "xdg"),
        HF_HUB_CACHE=str(tmp_path / "cache"),
        HF_HUB_DISABLE_TELEMETRY="1",
        NO_PROXY="127.0.0.1,localhost",
        no_proxy="127.0.0.1,localhost",
    )
    if endpoint:
        env["HF_ENDPOINT"] = endpoint
    env.update(extra)
    return env


def cli(env: dict, *args: str, pre: str = "") -> subprocess.CompletedProcess:
    code = f"{pre}\nimport sys\nfrom estimator.interface.cli import main\nsys.exit(main(sys.argv[1:]))"
    return subprocess.run(
        [sys.executable, "-c", code, "--gens", "8", "--json", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )


def one_line_error(r: subprocess.CompletedProcess) -> str:
    assert r.returncode == 2, (r.returncode, r.stdout[-500:], r.stderr[-2000:])
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert "Traceback" not in r.stderr
    return lines[0]


def test_fetch_estimates_then_cache_serves_offline(server, tmp_path):
    before = len(FakeHub.requests)
    r = cli(env_for(tmp_path, server), "--model", "acme/tiny-lm")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)  # an estimate came out
    fetched = list((tmp_path / "cache" / "models--acme--tiny-lm" / "snapshots").glob("*/config.json"))
    assert [p.parent.name for p in fetched] == [COMMIT]
    assert json.loads(fetched[0].read_text()) == TINY
    assert 1 <= len(FakeHub.requests) - before <= 6  # HEAD + GET, not one per resolve_model call

    # Offline: the cache serves it with no request at all, the same estimate.
    before = len(FakeHub.requests)
    offline = cli(env_for(tmp_path, server, HF_HUB_OFFLINE="1"), "--model", "acme/tiny-lm")
    assert offline.returncode == 0, offline.stderr
    assert json.loads(offline.stdout) == json.loads(r.stdout)
    assert len(FakeHub.requests) == before


def test_revision_is_fetched_and_cached(server, tmp_path):
    r = cli(env_for(tmp_path, server), "--model", "acme/tiny-lm@v1")
    assert r.returncode == 0, r.stderr
    assert any("/acme/tiny-lm/resolve/v1/config.json" in q for q in FakeHub.requests)
    ref = tmp_path / "cache" / "models--acme--tiny-lm" / "refs" / "v1"
    assert ref.read_text() == COMMIT
    offline = cli(env_for(tmp_path, server, HF_HUB_OFFLINE="1"), "--model", "acme/tiny-lm@v1")
    assert offline.returncode == 0, offline.stderr
    bad = one_line_error(cli(env_for(tmp_path, server), "--model", "acme/tiny-lm@nope"))
    assert "no revision 'nope'" in bad


def test_gated_needs_hf_token(server, tmp_path):
    line = one_line_error(cli(env_for(tmp_path, server), "--model", "acme/gated-lm"))
    assert "gated" in line and "HF_TOKEN" in line and "acme/gated-lm" in line
    ok = cli(env_for(tmp_path, server, HF_TOKEN=TOKEN), "--model", "acme/gated-lm")
    assert ok.returncode == 0, ok.stderr


def test_missing_repo_is_one_line(server, tmp_path):
    line = one_line_error(cli(env_for(tmp_path, server), "--model", "acme/no-such-model"))
    assert "no such model" in line and "acme/no-such-model" in line and "HF_TOKEN" in line


def test_offline_without_cache_prints_the_fetch_command(server, tmp_path):
    before = len(FakeHub.requests)
    line = one_line_error(cli(env_for(tmp_path, server, HF_HUB_OFFLINE="1"), "--model", "acme/tiny-lm@v1"))
    assert "`hf download acme/tiny-lm config.json --revision v1`" in line
    assert len(FakeHub.requests) == before


def test_unreachable_hub_is_one_line(tmp_path):
    # A port nobody listens on: connection refused at once (no internet, no hang).
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    line = one_line_error(cli(env_for(tmp_path, f"http://127.0.0.1:{port}"), "--model", "acme/tiny-lm"))
    assert "could not fetch config.json" in line and "hf download acme/tiny-lm config.json" in line
    # an endpoint with control characters is named escaped
    line = one_line_error(
        cli(env_for(tmp_path, f"http://127.0.0.1:{port}/\x1b[2J"), "--model", "acme/tiny-lm")
    )
    assert "\x1b" not in line and "\\x1b[2J" in line


def test_without_huggingface_hub_says_how_to_install(tmp_path):
    pre = "import sys; sys.modules['huggingface_hub'] = None"
    line = one_line_error(cli(env_for(tmp_path, "http://127.0.0.1:9"), "--model", "acme/tiny-lm", pre=pre))
    assert "pip install 'grpo-vram[hub]'" in line


def test_bad_ids_never_reach_the_network(tmp_path):
    for spec in ["acme/../etc", "acme/x@../../y", "-rf/x", "acme/a--b", "x" * 2000, "acme/x\x00y", "acme/x@"]:
        assert hub.split_id(spec) is None or len(spec) > 1024, spec
    line = one_line_error(cli(env_for(tmp_path, "http://127.0.0.1:9"), "--model", "acme/\x1b[31mred"))
    assert "\x1b" not in line


def test_in_process_fetch_and_note(server, tmp_path, monkeypatch):
    from estimator.model.catalog import resolve_model_with_note

    for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HOME"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", server)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    # huggingface_hub may have been imported offline by an earlier test: its own flag is read at import.
    constants = pytest.importorskip("huggingface_hub.constants")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    arch, note = resolve_model_with_note("acme/tiny-lm", revision=COMMIT)
    assert (arch.total_params, arch.name, note) == (TINY_PARAMS, f"acme/tiny-lm@{COMMIT}", None)
    arch, note = resolve_model_with_note("8b")
    assert arch.name == "Qwen/Qwen3-8B" and "Qwen/Qwen3-8B" in note and "\n" not in note


def test_cached_config_follows_refs(tmp_path):
    repo = tmp_path / "models--acme--R"
    for commit in ("a" * 40, "b" * 40):
        (repo / "snapshots" / commit).mkdir(parents=True)
        (repo / "snapshots" / commit / "config.json").write_text("{}")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("a" * 40)
    (repo / "refs" / "v2").write_text("b" * 40)
    assert hub.cached_config("acme/R", None, [tmp_path]).parent.name == "a" * 40
    assert hub.cached_config("acme/r", "v2", [tmp_path]).parent.name == "b" * 40
    assert hub.cached_config("acme/R", "b" * 40, [tmp_path]).parent.name == "b" * 40
    assert hub.cached_config("acme/R", "v3", [tmp_path]) is None
