"""
A local Hugging Face Hub for tests: real HTTP on 127.0.0.1, nothing else reached.

Downloads are served by olah (PyPI: a self-hosted Hub mirror) from plain git repositories under one folder
(`<root>/models/<owner>/<name>`), in its offline mode: it resolves branches, tags and commit hashes, lists trees and
answers `resolve/` with the ETag and X-Repo-Commit headers huggingface_hub checks, and never contacts an upstream
Hub. olah is read-only, so the child process adds the four endpoints an upload uses (create repo, validate README
metadata, preupload, commit; see `_add_routes`), which commit into the same git repositories: a pushed pipeline
is downloaded back through olah.

The server runs in a child process (olah's logger takes over its process's stdout and stderr) that serves a socket
the fixture bound to an ephemeral loopback port; it stops at teardown, when the test process dies, or after
`LIFETIME_S`, whichever comes first. `python -m tests.hub_server ROOT` serves ROOT on a free port by hand.
"""

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest


LIFETIME_S = 600  # the child exits on its own past this, whatever happens to the test process
START_TIMEOUT_S = 30
GIT_IDENTITY = ["-c", "user.name=untied-sc tests", "-c", "user.email=tests@localhost", "-c", "commit.gpgsign=false"]


def _git(repo: Path, *args: str) -> str:
    result = subprocess.run(["git", *GIT_IDENTITY, *args], cwd=repo, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} in {repo} failed: {result.stderr.strip()}")
    return result.stdout.strip()


def repo_folder(root: Path, repo_id: str) -> Path:
    """`<root>/models/<owner>/<name>`, or `<root>/models/<name>` for an id without owner (`t5-small`), as olah looks
    them up."""
    parts = repo_id.split("/")
    if len(parts) > 2 or not all(parts):
        raise ValueError(f"{repo_id!r} is not a Hub repo id (NAME or OWNER/NAME)")
    return Path(root, "models", *parts)


def init_repo(folder: Path) -> None:
    """A git repository with the Hub's initial commit (a `.gitattributes`), on branch `main`."""
    folder.mkdir(parents=True)
    _git(folder, "init", "-q", "-b", "main")
    (folder / ".gitattributes").write_text("*.safetensors filter=lfs diff=lfs merge=lfs -text\n")
    _git(folder, "add", "-A")
    _git(folder, "commit", "-q", "-m", "initial commit")


def commit_all(folder: Path, message: str) -> str:
    # The index is emptied first so that `add` hashes every file: git trusts a file whose stat matches its index entry,
    # and a file replaced within the same second by one of the same size (its inode reused, its older mtime kept by
    # the copy) matches, so the commit would silently keep the old content.
    _git(folder, "rm", "-r", "-q", "--cached", "--ignore-unmatch", ".")
    _git(folder, "add", "-A")
    _git(folder, "commit", "-q", "--allow-empty", "-m", message)
    return _git(folder, "rev-parse", "HEAD")


@dataclass
class LocalHub:
    """The running server: `endpoint` for `HF_ENDPOINT`, `root` the git repositories it serves; `cache` the
    Hugging Face cache a test downloads into (set per test)."""

    endpoint: str
    root: Path
    cache: Path | None = None

    def commit(self, repo_id: str, source: Path | dict[str, bytes | str], message: str = "upload") -> str:
        """
        Commits `source` (a folder, or {path: content}) as the whole content of `repo_id`'s `main`, creating the repo
        if needed; returns the commit hash. Files of the previous commit that `source` lacks are deleted, as a Hub
        upload with `delete_patterns="*"` would.
        """
        folder = repo_folder(self.root, repo_id)
        if not folder.exists():
            init_repo(folder)
        for entry in folder.iterdir():
            if entry.name not in (".git", ".gitattributes"):
                shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
        if isinstance(source, dict):
            for path, content in source.items():
                target = folder / path
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(content.encode() if isinstance(content, str) else content)
        else:
            shutil.copytree(source, folder, dirs_exist_ok=True)
        return commit_all(folder, message)

    def tag(self, repo_id: str, name: str, revision: str = "HEAD") -> None:
        _git(repo_folder(self.root, repo_id), "tag", name, revision)

    def branch(self, repo_id: str, name: str, revision: str = "HEAD") -> None:
        _git(repo_folder(self.root, repo_id), "branch", name, revision)

    def files(self, repo_id: str, revision: str = "main") -> list[str]:
        """The files of `repo_id` at `revision`, as the git repository holds them."""
        return _git(repo_folder(self.root, repo_id), "ls-tree", "-r", "--name-only", revision).splitlines()


def _wait_until_serving(port: int, process: subprocess.Popen, deadline: float) -> str | None:
    """None once the server answers an HTTP request; otherwise why it did not."""
    request = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return f"the server exited with code {process.returncode}"
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=2) as connection:
                connection.sendall(request)
                if connection.recv(16).startswith(b"HTTP/"):
                    return None
        except OSError:
            pass
        time.sleep(0.1)
    return f"no HTTP answer within {START_TIMEOUT_S} s"


@pytest.fixture(scope="session")
def local_hub(tmp_path_factory) -> Iterator[LocalHub]:
    """Starts the server for the test session; skips (with the reason) where it cannot start."""
    if shutil.which("git") is None:
        pytest.skip("the local Hub serves git repositories and `git` is not on PATH")
    try:
        import olah.server  # noqa: F401
    except ImportError as error:
        pytest.skip(f"the local Hub needs olah (`pip install -e '.[test]'`): {error}")
    base = tmp_path_factory.mktemp("local-hub")
    root, logs, output = base / "repos", base / "logs", base / "server-output.txt"
    root.mkdir()
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))  # loopback only, port chosen by the kernel
    listener.listen(64)
    port = listener.getsockname()[1]
    repo_root = str(Path(__file__).parent.parent)  # so that the child finds `tests.hub_server`
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [repo_root, os.environ.get("PYTHONPATH")]))}
    command = [sys.executable, "-m", "tests.hub_server", str(root), "--fd", str(listener.fileno())]
    command += ["--logs", str(logs), "--parent", str(os.getpid())]
    with output.open("w") as sink:
        process = subprocess.Popen(command, pass_fds=[listener.fileno()], env=env, stdout=sink, stderr=sink)
    listener.close()  # the child holds its own copy
    try:
        problem = _wait_until_serving(port, process, time.monotonic() + START_TIMEOUT_S)
        if problem is not None:
            texts = [path.read_text(errors="replace") for path in (output, *sorted(logs.glob("*")))]
            pytest.skip(f"the local Hub did not start: {problem}. Its output ends: {''.join(texts)[-1500:]}")
        yield LocalHub(endpoint=f"http://127.0.0.1:{port}", root=root)
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


# ---- the child process ----


def _add_routes(app, root: Path) -> None:
    """
    Adds, ahead of olah's own routes: the endpoints `HfApi.create_repo`, `create_commit` and `upload_folder` call,
    over olah's git repositories (every file is taken inline: "regular" upload mode, base64 in the commit, so no LFS
    or Xet storage is involved); the repo info without a revision (`HfApi.model_info(repo_id)`, which diffusers
    calls), which olah's offline mode answers only from its upstream cache: here it is the info at `main`; and a 404
    `RevisionNotFound` for an unknown revision of a known repo and a 404 `EntryNotFound` for a folder it lacks
    (transformers lists `additional_chat_templates/`), where olah answers "repo not found"; for ids with an owner and
    without one (`t5-small`).
    """
    import base64
    import json

    from fastapi import Request
    from fastapi.responses import JSONResponse
    from olah.server_api_routes import meta_proxy_common, tree_proxy_common

    olah_routes = list(app.router.routes)

    def endpoint(request: Request) -> str:
        return f"{request.url.scheme}://{request.url.netloc}"

    @app.post("/api/repos/create")
    async def create_repo(request: Request):
        body = await request.json()
        if body.get("type", "model") != "model":
            return JSONResponse({"error": "the local Hub holds model repos only"}, status_code=400)
        repo_id = f"{body['organization']}/{body['name']}" if body.get("organization") else body["name"]
        if "/" not in repo_id:
            repo_id = f"user/{repo_id}"
        folder = repo_folder(root, repo_id)
        if folder.exists():
            return JSONResponse(
                {"error": "You already created this model repo", "url": f"{endpoint(request)}/{repo_id}"}, 409
            )
        init_repo(folder)
        return {"url": f"{endpoint(request)}/{repo_id}", "name": repo_id}

    @app.post("/api/validate-yaml")
    async def validate_yaml(request: Request):
        return {"errors": [], "warnings": []}

    @app.post("/api/models/{owner}/{name}/preupload/{revision}")
    async def preupload(owner: str, name: str, revision: str, request: Request):
        if not repo_folder(root, f"{owner}/{name}").exists():
            return JSONResponse({"error": "Repository not found"}, 404, headers={"X-Error-Code": "RepoNotFound"})
        files = (await request.json())["files"]
        return {"files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False} for f in files]}

    @app.post("/api/models/{owner}/{name}/commit/{revision}")
    async def commit(owner: str, name: str, revision: str, request: Request):
        folder = repo_folder(root, f"{owner}/{name}")
        if not folder.exists():
            return JSONResponse({"error": "Repository not found"}, 404, headers={"X-Error-Code": "RepoNotFound"})
        if revision != "main" or request.query_params.get("create_pr"):
            return JSONResponse({"error": "the local Hub commits to `main` only"}, status_code=400)
        header = {}
        for line in (await request.body()).splitlines():
            item = json.loads(line)
            key, value = item["key"], item["value"]
            target = folder / value.get("path", "")
            if folder.resolve() not in target.resolve().parents and key != "header":
                return JSONResponse({"error": f"path {value['path']!r} leaves the repository"}, status_code=400)
            if key == "header":
                header = value
            elif key == "file":
                if value.get("encoding") != "base64":
                    return JSONResponse({"error": "only base64 file content is accepted"}, status_code=400)
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(base64.b64decode(value["content"]))
            elif key == "deletedFile":
                target.unlink()
            elif key == "deletedFolder":
                shutil.rmtree(target)
            else:
                return JSONResponse({"error": f"the local Hub does not take {key!r} operations"}, status_code=400)
        message = "\n\n".join(part for part in (header.get("summary"), header.get("description")) if part)
        sha = commit_all(folder, message or "upload")
        url = f"{endpoint(request)}/{owner}/{name}/commit/{sha}"
        return {"commitUrl": url, "commitOid": sha, "pullRequestUrl": None}

    @app.api_route("/api/models/{owner}/{name}", methods=["GET", "HEAD"])
    async def model_info(owner: str, name: str, request: Request):
        return await model_info_at(owner, name, "main", request)

    @app.api_route("/api/models/{name}", methods=["GET", "HEAD"])  # an id without owner (`t5-small`)
    async def model_info_of_name(name: str, request: Request):
        return await model_info_at(None, name, "main", request)

    @app.api_route("/api/models/{name}/revision/{revision:path}", methods=["GET", "HEAD"])
    async def model_info_of_name_at(name: str, revision: str, request: Request):
        return await model_info_at(None, name, revision, request)

    @app.api_route("/api/models/{owner}/{name}/revision/{revision:path}", methods=["GET", "HEAD"])
    async def model_info_at(owner: str | None, name: str, revision: str, request: Request):
        folder = repo_folder(root, f"{owner}/{name}" if owner else name)
        if folder.exists():  # olah answers an unknown revision of a known repo as an unknown repo; the Hub does not
            try:
                _git(folder, "rev-parse", "--verify", "--quiet", f"{revision}^{{commit}}")
            except RuntimeError:
                headers = {"X-Error-Code": "RevisionNotFound", "X-Error-Message": f"Invalid rev id: {revision}"}
                return JSONResponse({"error": f"Invalid rev id: {revision}"}, status_code=404, headers=headers)
        authorization = request.headers.get("authorization")
        return await meta_proxy_common(app, "models", owner, name, revision, request.method.lower(), authorization)

    @app.api_route("/api/models/{name}/tree/{revision}/{path:path}", methods=["GET", "HEAD"])
    async def tree_of_name(name: str, revision: str, path: str, request: Request):
        return await tree(None, name, revision, path, request)

    @app.api_route("/api/models/{owner}/{name}/tree/{revision}/{path:path}", methods=["GET", "HEAD"])
    async def tree(owner: str | None, name: str, revision: str, path: str, request: Request):
        folder = repo_folder(root, f"{owner}/{name}" if owner else name)
        if folder.exists() and path.strip("/"):  # olah answers a missing folder as a missing repo; the Hub does not
            try:
                _git(folder, "cat-file", "-e", f"{revision}:{path.strip('/')}")
            except RuntimeError:
                headers = {"X-Error-Code": "EntryNotFound", "X-Error-Message": f"{path} does not exist on {revision}"}
                return JSONResponse({"error": headers["X-Error-Message"]}, status_code=404, headers=headers)
        query = request.query_params
        return await tree_proxy_common(
            app,
            repo_type="models",
            org=owner,
            repo=name,
            commit=revision,
            path=path,
            recursive=query.get("recursive", "false").lower() == "true",
            expand=query.get("expand", "false").lower() == "true",
            method=request.method.lower(),
            authorization=request.headers.get("authorization"),
        )

    ours = [route for route in app.router.routes if route not in olah_routes]
    app.router.routes[:] = ours + olah_routes


def _exit_when_orphaned_or_old(parent: int | None) -> None:
    """Ends the process when the test process is gone or `LIFETIME_S` has passed (a bounded lifetime)."""
    import threading

    def watch() -> None:
        started = time.monotonic()
        while time.monotonic() - started < LIFETIME_S:
            if parent is not None and os.getppid() != parent:
                break
            time.sleep(0.5)
        os._exit(0)

    threading.Thread(target=watch, daemon=True).start()


def serve(root: Path, fd: int | None, logs: Path, parent: int | None = None) -> None:
    """Serves `root`'s git repositories (olah offline) plus the upload endpoints, on socket `fd` or a free port."""
    import uvicorn
    from olah import server
    from olah.configs import OlahConfig
    from olah.utils.logging import build_logger

    if fd is None:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        print(f"HF_ENDPOINT=http://127.0.0.1:{listener.getsockname()[1]}", flush=True)
    else:
        listener = socket.socket(fileno=fd)
    host, port = listener.getsockname()[:2]
    config = OlahConfig()
    config.host, config.port = host, port
    config.offline = True  # never reach an upstream Hub ...
    config.hf_netloc = config.hf_lfs_netloc = "127.0.0.1:9"  # ... and were it asked to, a closed loopback port
    config.mirrors_path = [str(root)]
    config.repos_path = tempfile.mkdtemp(prefix="olah-cache-")
    config.mirror_netloc = config.mirror_lfs_netloc = f"{host}:{port}"
    config.metadata_cache_ttl = 0  # branches move under the tests' feet
    server.logger = server.app.state.logger = build_logger("olah", "olah.log", logger_dir=str(logs))
    server.app.state.app_settings = server.AppSettings(config=config)
    _add_routes(server.app, Path(root))
    _exit_when_orphaned_or_old(parent)
    uvicorn.Server(uvicorn.Config(server.app, log_level="warning", lifespan="off")).run(sockets=[listener])


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="A local Hub-compatible server over a folder of git repositories.")
    parser.add_argument("root", type=Path, help="Folder of repositories: ROOT/models/OWNER/NAME (git).")
    parser.add_argument("--fd", type=int, help="An already bound, listening socket to serve (default: a free port).")
    parser.add_argument("--logs", type=Path, default=Path(tempfile.gettempdir()) / "local-hub-logs")
    parser.add_argument("--parent", type=int, help="Exit when this process is no longer the parent.")
    args = parser.parse_args()
    serve(args.root, args.fd, args.logs, args.parent)
