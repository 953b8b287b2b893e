"""`lkv export --push-to-hub` with the real huggingface_hub client against a fake Hub on 127.0.0.1.

The fake implements only what ``create_repo`` + ``create_branch`` + ``upload_folder`` use in
huggingface_hub 2.x (Xet disabled): repo creation, README metadata validation, preupload
(regular vs LFS), the LFS batch API with a basic PUT upload and verify, and the NDJSON commit.
"""

import base64
import hashlib
import json
import logging
import socket
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from urllib.parse import unquote, urlparse

import pytest
from helpers import bundle_files, lkv, one_line_error

pytestmark = pytest.mark.filterwarnings("ignore:Use .content=:DeprecationWarning")  # inside huggingface_hub
TOKEN = "hf_fakeTOKEN_do_not_leak_8c1f0e"
REPO = "lkv-test/lookaheadkv-tiny"
LFS_SUFFIXES = (".safetensors", ".png")


class FakeHub:
    """Serves at most ``max_requests`` requests on a loopback port; records what it received."""

    def __init__(self, fail: int | None = None, max_requests: int = 200):
        self.fail, self.max_requests, self.handled = fail, max_requests, 0
        self.repos: dict[str, dict] = {}  # repo id -> {"private", "branches", "files": {rev: {path: bytes}}, "commits"}
        self.blobs: dict[str, bytes] = {}
        self.requests: list[tuple[str, str]] = []
        self.server = HTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self.server.timeout = 0.2
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(timeout=5)
        self.server.server_close()

    def _loop(self):
        while not self._stop.is_set() and self.handled < self.max_requests:
            self.server.handle_request()

    def files(self, repo=REPO, revision="main") -> dict[str, bytes]:
        return self.repos[repo]["files"].get(revision, {})

    # ---------------------------------------------------------------- routing
    def route(self, method: str, path: str, headers, body: bytes):
        """(status, json, extra headers) for one request."""
        self.handled += 1
        self.requests.append((method, path))
        if self.fail == 401:
            return 401, {"error": "Invalid credentials in Authorization header"}, {}
        if self.fail == 404:
            return 404, {"error": "Repository not found"}, {"X-Error-Code": "RepoNotFound"}
        if path.startswith("/lfs/"):  # presigned storage URLs carry no token
            return self.lfs_store(method, path, body)
        if headers.get("Authorization") != f"Bearer {TOKEN}":
            return 401, {"error": "Invalid credentials in Authorization header"}, {}
        kind = headers.get("Content-Type", "")
        data = json.loads(body) if body and "json" in kind and "ndjson" not in kind else None
        parts = [unquote(p) for p in path.strip("/").split("/")]
        if method == "POST" and path == "/api/repos/create":
            repo = f"{data['organization']}/{data['name']}" if data.get("organization") else data["name"]
            if repo in self.repos:
                return 409, {"error": "You already created this model repo", "url": f"{self.url}/{repo}"}, {}
            self.repos[repo] = {"private": data.get("visibility") == "private", "branches": {"main"}, "files": {},
                                "commits": []}
            return 200, {"url": f"{self.url}/{repo}"}, {}
        if method == "POST" and path == "/api/validate-yaml":
            return 200, {"errors": [], "warnings": []}, {}
        if method == "POST" and path.endswith("/info/lfs/objects/batch"):
            return 200, {"objects": [{"oid": o["oid"], "size": o["size"], "authenticated": True,
                                      "actions": {"upload": {"href": f"{self.url}/lfs/{o['oid']}"},
                                                  "verify": {"href": f"{self.url}/lfs/verify"}}}
                                     for o in data["objects"]]}, {}
        if parts[:2] == ["api", "models"] and len(parts) >= 6:
            repo, action, rev = f"{parts[2]}/{parts[3]}", parts[4], "/".join(parts[5:])
            if repo not in self.repos:
                return 404, {"error": "Repository not found"}, {"X-Error-Code": "RepoNotFound"}
            if method == "POST" and action == "branch":
                self.repos[repo]["branches"].add(rev)
                return 200, {}, {}
            if rev not in self.repos[repo]["branches"]:
                return 404, {"error": "Invalid rev id"}, {"X-Error-Code": "RevisionNotFound"}
            if method == "POST" and action == "preupload":
                return 200, {"files": [{"path": f["path"], "shouldIgnore": False,
                                        "uploadMode": "lfs" if f["path"].endswith(LFS_SUFFIXES) else "regular"}
                                       for f in data["files"]]}, {}
            if method == "POST" and action == "commit":
                return self.commit(repo, rev, body)
        return 404, {"error": f"fake hub: no route for {method} {path}"}, {}

    def lfs_store(self, method: str, path: str, body: bytes):
        if method == "POST" and path == "/lfs/verify":
            return 200, {}, {}
        oid = path.rsplit("/", 1)[-1]
        if method != "PUT" or hashlib.sha256(body).hexdigest() != oid:
            return 400, {"error": "bad LFS upload"}, {}
        self.blobs[oid] = body
        return 200, {}, {}

    def commit(self, repo: str, rev: str, body: bytes):
        lines = [json.loads(line) for line in body.decode().splitlines() if line.strip()]
        header, files = lines[0]["value"], {}
        for line in lines[1:]:
            value = line["value"]
            if line["key"] == "file":
                files[value["path"]] = base64.b64decode(value["content"])
            elif line["key"] == "lfsFile":
                if value["oid"] not in self.blobs:
                    return 400, {"error": f"LFS object {value['oid']} was never uploaded"}, {}
                files[value["path"]] = self.blobs[value["oid"]]
        entry = self.repos[repo]
        entry["files"].setdefault(rev, {}).update(files)
        entry["commits"].append({"revision": rev, "summary": header["summary"], "paths": sorted(files)})
        oid = hashlib.sha1(json.dumps(entry["commits"]).encode()).hexdigest()
        return 200, {"commitUrl": f"{self.url}/{repo}/commit/{oid}", "commitOid": oid}, {}

    def _handler(self):
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def _body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    out = b""
                    while True:
                        size = int(self.rfile.readline().split(b";")[0], 16)
                        if size == 0:
                            self.rfile.readline()
                            return out
                        out += self.rfile.read(size)
                        self.rfile.readline()
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def _serve(self):
                try:
                    status, payload, extra = hub.route(self.command, urlparse(self.path).path, self.headers,
                                                       self._body())
                except Exception as exc:  # a bug in the fake: 400 (never retried), not a dropped connection
                    status, payload, extra = 400, {"error": f"fake hub: {exc!r}"}, {}
                data = json.dumps(payload).encode()
                self.send_response(status)
                for key, value in {"Content-Type": "application/json", "Content-Length": str(len(data)),
                                   **extra}.items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = _serve

            def log_message(self, *args):
                pass

        return Handler


@pytest.fixture
def hub_env(monkeypatch, tmp_path):
    """HF_TOKEN set, no login cache, Xet off (the fake speaks the LFS protocol)."""
    from huggingface_hub import constants

    monkeypatch.setenv("HF_TOKEN", TOKEN)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_PROGRESS_BARS", True)
    return monkeypatch


def no_token_anywhere(result, folder, caplog):
    texts = [result.output, caplog.text] + [data.decode("latin-1") for data in bundle_files(folder).values()]
    assert not any(TOKEN in text for text in texts)


def test_export_and_push_end_to_end(trained_run, hub_env, tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    out = tmp_path / "bundle"
    with FakeHub() as hub:
        hub_env.setenv("HF_ENDPOINT", hub.url)
        r = lkv("--json", "export", trained_run["run"], "--out", out, "--no-model-check", "--push-to-hub", REPO,
                "--private")
        assert r.exit_code == 0, r.output
        local = bundle_files(out)
        assert hub.files() == local  # every file, byte for byte
        assert {"README.md", "lkv.json", "adapter_config.json", "adapter_model.safetensors",
                "lookahead_embeddings.safetensors"} <= set(local)
        assert hub.repos[REPO]["private"] and REPO in local["README.md"].decode()  # the card shows the repo id
        assert set(hub.blobs) == {hashlib.sha256(local[n]).hexdigest() for n in local if n.endswith(LFS_SUFFIXES)}
        assert json.loads(r.stdout[r.stdout.index("{"):])["pushed"].startswith(f"{hub.url}/{REPO}/commit/")
        no_token_anywhere(r, out, caplog)

        again = lkv("export", out, "--push-to-hub", REPO, "--revision", "v1", "--commit-message", "again")
        assert again.exit_code == 0, again.output
        assert [c["summary"] for c in hub.repos[REPO]["commits"]][-1] == "again"
        assert hub.files(revision="v1") == local and hub.files() == local and bundle_files(out) == local
        no_token_anywhere(again, out, caplog)
        assert hub.handled < hub.max_requests


def test_no_token_sends_nothing(trained_run, hub_env, tmp_path):
    out = tmp_path / "bundle"
    hub_env.delenv("HF_TOKEN")
    with FakeHub() as hub:
        hub_env.setenv("HF_ENDPOINT", hub.url)
        r = lkv("export", trained_run["run"], "--out", out, "--no-model-check", "--push-to-hub", REPO)
        one_line_error(r, "HF_TOKEN", "hf auth login", "nothing was sent")
        assert hub.requests == [] and (out / "lkv.json").is_file()


def _refused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("failure, needles", [
    (401, ["401", "refused the token"]),
    (404, ["404", "not found"]),
    ("refused", ["could not reach", "HF_ENDPOINT"]),
])
def test_failed_push_keeps_the_bundle(trained_run, hub_env, tmp_path, caplog, failure, needles):
    out = tmp_path / "bundle"
    r = lkv("export", trained_run["run"], "--out", out, "--no-model-check")
    assert r.exit_code == 0, r.output
    before = bundle_files(out)
    with FakeHub(fail=failure if failure != "refused" else None) as hub:
        hub_env.setenv("HF_ENDPOINT", hub.url if failure != "refused" else f"http://127.0.0.1:{_refused_port()}")
        r = lkv("export", out, "--push-to-hub", REPO)
    one_line_error(r, *needles, "is intact", f"lkv export {out} --push-to-hub {REPO}")
    assert bundle_files(out) == before
    no_token_anywhere(r, out, caplog)


@pytest.mark.parametrize("repo", ["bad//id", "org/na me", "a/b/c", "org/name.git", "-org/x"])
def test_invalid_repo_id_fails_before_any_work(trained_run, hub_env, tmp_path, repo):
    out = tmp_path / "bundle"
    one_line_error(lkv("export", trained_run["run"], "--out", out, "--push-to-hub", repo), "invalid repo id")
    assert not out.exists()


def test_killed_at_the_push_then_pushed_again(bundle, hub_env, tmp_path):
    """The process dies abruptly at the `push` write point (`lkvcli.faults`): the local bundle is intact and
    the same push, run again, uploads every file."""
    import os
    import shutil
    import subprocess
    import sys

    from lkvcli.bundle import read_bundle
    from lkvcli.faults import FAULT_EXIT

    local = shutil.copytree(bundle, tmp_path / "bundle")
    with FakeHub() as hub:
        env = {**os.environ, "HF_ENDPOINT": hub.url, "OMP_NUM_THREADS": "1"}
        command = [sys.executable, "-m", "lkvcli", "export", str(local), "--push-to-hub", REPO]
        died = subprocess.run(command, env={**env, "LKV_FAULT": "push:1"}, capture_output=True, text=True, timeout=120)
        assert died.returncode == FAULT_EXIT and REPO not in hub.repos
        assert read_bundle(local).meta["num_tokens"] == 4
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        assert hub.files() == bundle_files(local) and TOKEN not in done.stdout + done.stderr
