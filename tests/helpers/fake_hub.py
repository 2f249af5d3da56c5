"""A small local stand-in for the Hugging Face Hub: one model repo, served as the Hub serves it.

Enough of the Hub for ``huggingface_hub``'s own download code (``hf_hub_download``,
``snapshot_download``, ``HfFileSystem.ls``) as vLLM calls it with ``HF_ENDPOINT`` set:

* ``HEAD``/``GET /{repo}/resolve/{rev}/{file}``: a regular file answers 200 with ``ETag``,
  ``Content-Length`` and ``X-Repo-Commit``; an LFS file (``*.safetensors``) answers 302 to an
  absolute CDN address (``http://127.0.0.2:PORT/cdn/{sha256}``, another host) with ``X-Linked-Etag``, ``X-Linked-Size`` and
  ``X-Repo-Commit``, as the Hub does; a missing file is 404 with ``X-Error-Code: EntryNotFound``;
* ``GET /cdn/{sha256}``: the bytes, ``Range`` honoured, throttled to ``rate_bps`` and held while
  :meth:`FakeHub.pause` is on (the connection stays open, no byte comes: a stalled download);
* ``GET /api/models/{repo}[/revision/{rev}]``: the model info with its ``siblings``;
  ``GET /api/models/{repo}/tree/{rev}[/{path}]``: the file list (HfFileSystem.ls).

Every request is noted in ``requests``; the CDN's bytes in ``served`` with their times
(``served_at(t)``: the bytes sent by monotonic time ``t``). Loopback only; a test helper.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

COMMIT = "0123456789abcdef0123456789abcdef01234567"
CHUNK = 64 * 1024


class FakeHub:
    def __init__(self, repo: str, files: dict[str, Path], *, rate_bps: float) -> None:
        self.repo = repo
        self.files = files
        self.rate_bps = rate_bps
        self.requests: list[str] = []
        self._served = 0
        self._series: list[tuple[float, int]] = [(time.monotonic(), 0)]
        self._lock = threading.Lock()
        self._running = threading.Event()
        self._running.set()
        self.sha: dict[str, str] = {}
        self.git: dict[str, str] = {}
        for name, p in files.items():
            data_hash = hashlib.sha256()
            with open(p, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    data_hash.update(block)
            self.sha[name] = data_hash.hexdigest()
            self.git[name] = hashlib.sha1(f"{name}:{p.stat().st_size}".encode()).hexdigest()
        self.by_sha = {v: k for k, v in self.sha.items()}
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        # The CDN on another host (huggingface_hub follows a HEAD's redirect within the Hub's host only)
        self.cdn = ThreadingHTTPServer(("127.0.0.2", 0), self._handler())
        self.threads = []
        for srv in (self.server, self.cdn):
            srv.daemon_threads = True
            self.threads.append(threading.Thread(target=srv.serve_forever, daemon=True))

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    @property
    def cdn_url(self) -> str:
        return f"http://127.0.0.2:{self.cdn.server_address[1]}"

    def __enter__(self) -> FakeHub:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._running.set()
        for srv in (self.server, self.cdn):
            srv.shutdown()
            srv.server_close()

    def pause(self) -> None:
        self._running.clear()

    def resume(self) -> None:
        self._running.set()

    @property
    def served(self) -> int:
        return self._served

    def served_at(self, t: float) -> int:
        with self._lock:
            best = 0
            for ts, n in self._series:
                if ts > t:
                    break
                best = n
            return best

    @staticmethod
    def is_lfs(name: str) -> bool:
        return name.endswith(".safetensors")

    def _count(self, n: int) -> None:
        with self._lock:
            self._served += n
            self._series.append((time.monotonic(), self._served))

    def siblings(self) -> list[dict[str, Any]]:
        return [{"rfilename": n} for n in sorted(self.files)]

    def tree(self) -> list[dict[str, Any]]:
        out = []
        for n in sorted(self.files):
            size = self.files[n].stat().st_size
            e: dict[str, Any] = {"type": "file", "oid": self.git[n], "size": size, "path": n}
            if self.is_lfs(n):
                e["lfs"] = {"oid": self.sha[n], "size": size, "pointerSize": 134}
            out.append(e)
        return out

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        hub = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a: Any) -> None:
                pass

            def _json(self, obj: Any, status: int = 200) -> None:
                body = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.send_header("X-Repo-Commit", COMMIT)
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def _missing(self, code: str = "EntryNotFound") -> None:
                self.send_response(404)
                self.send_header("X-Error-Code", code)
                self.send_header("X-Repo-Commit", COMMIT)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_HEAD(self) -> None:
                self._route()

            def do_GET(self) -> None:
                self._route()

            def _route(self) -> None:
                hub.requests.append(f"{self.command} {self.path}")
                path = self.path.split("?", 1)[0]
                api = f"/api/models/{hub.repo}"
                if path in (api, f"{api}/revision/main", f"{api}/revision/{COMMIT}"):
                    return self._json({"id": hub.repo, "modelId": hub.repo, "sha": COMMIT, "private": False,
                                       "gated": False, "disabled": False, "siblings": hub.siblings(), "tags": []})
                if path.startswith(f"{api}/tree/"):
                    rest = path[len(f"{api}/tree/"):].split("/", 1)
                    sub = rest[1].strip("/") if len(rest) > 1 else ""
                    return self._json(hub.tree() if sub == "" else [])
                if path.startswith("/api/"):
                    return self._missing("RepoNotFound" if hub.repo not in path else "EntryNotFound")
                prefix = f"/{hub.repo}/resolve/"
                if path.startswith(prefix):
                    rev_file = path[len(prefix):].split("/", 1)
                    name = rev_file[1] if len(rev_file) > 1 else ""
                    return self._resolve(name)
                if path.startswith("/cdn/"):
                    return self._cdn(path[len("/cdn/"):])
                if not path.startswith(f"/{hub.repo}/"):
                    return self._missing("RepoNotFound")
                return self._missing()

            def _resolve(self, name: str) -> None:
                p = hub.files.get(name)
                if p is None:
                    return self._missing()
                size = p.stat().st_size
                if hub.is_lfs(name):
                    self.send_response(302)
                    self.send_header("Location", f"{hub.cdn_url}/cdn/{hub.sha[name]}")
                    self.send_header("X-Linked-Etag", f'"{hub.sha[name]}"')
                    self.send_header("X-Linked-Size", str(size))
                    self.send_header("ETag", f'"{hub.git[name]}"')
                    self.send_header("X-Repo-Commit", COMMIT)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return None
                body = p.read_bytes()
                self.send_response(200)
                self.send_header("ETag", f'"{hub.git[name]}"')
                self.send_header("X-Repo-Commit", COMMIT)
                self.send_header("Content-Length", str(size))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)
                return None

            def _cdn(self, sha: str) -> None:
                name = hub.by_sha.get(sha)
                if name is None:
                    return self._missing()
                p = hub.files[name]
                size = p.stat().st_size
                start = 0
                rng = self.headers.get("Range")
                if rng and rng.startswith("bytes="):
                    start = int(rng[6:].split("-", 1)[0] or 0)
                self.send_response(206 if start else 200)
                if start:
                    self.send_header("Content-Range", f"bytes {start}-{size - 1}/{size}")
                self.send_header("Content-Length", str(size - start))
                self.send_header("ETag", f'"{sha}"')
                self.send_header("Content-Disposition", f'attachment; filename="{name}"')
                self.end_headers()
                if self.command == "HEAD":
                    return None
                t0 = time.monotonic()
                sent = 0
                with open(p, "rb") as f:
                    f.seek(start)
                    while True:
                        hub._running.wait()
                        block = f.read(CHUNK)
                        if not block:
                            break
                        # throttle: never ahead of rate_bps since this response began
                        ahead = (sent + len(block)) / hub.rate_bps - (time.monotonic() - t0)
                        if ahead > 0:
                            time.sleep(ahead)
                        if not hub._running.is_set():
                            hub._running.wait()
                            t0 = time.monotonic() - sent / hub.rate_bps
                        try:
                            self.wfile.write(block)
                        except OSError:
                            return None
                        sent += len(block)
                        hub._count(len(block))
                return None

        return H


def padded_model(src: Path, dst: Path, pad_bytes: int) -> dict[str, Path]:
    """The tiny model in ``dst`` as a two-shard repo: its own ``model.safetensors`` renamed to shard 1,
    and shard 2 one tensor of ``pad_bytes`` that vLLM's Llama loader drops by name
    (``*.rotary_emb.inv_freq`` maps to nothing), named by a ``model.safetensors.index.json``."""
    import struct

    dst.mkdir(parents=True, exist_ok=True)
    files: dict[str, Path] = {}
    for p in src.iterdir():
        if p.is_file() and p.name != "model.safetensors":
            files[p.name] = p
    s1 = src / "model.safetensors"
    raw = s1.read_bytes()[:8]
    (hlen,) = struct.unpack("<Q", raw)
    header = json.loads(s1.read_bytes()[8:8 + hlen])
    shard1, shard2 = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
    files[shard1] = s1
    pad_name = "model.layers.0.self_attn.rotary_emb.inv_freq"
    h2 = json.dumps({pad_name: {"dtype": "U8", "shape": [pad_bytes], "data_offsets": [0, pad_bytes]}}).encode()
    h2 += b" " * (-len(h2) % 8)
    p2 = dst / shard2
    if not p2.exists() or p2.stat().st_size != 8 + len(h2) + pad_bytes:
        with open(p2, "wb") as f:
            f.write(struct.pack("<Q", len(h2)) + h2)
            block = bytes(range(256)) * 4096
            left = pad_bytes
            while left > 0:
                f.write(block[: min(left, len(block))])
                left -= len(block)
    files[shard2] = p2
    tensors = {k: v for k, v in header.items() if k != "__metadata__"}
    total = sum(v["data_offsets"][1] - v["data_offsets"][0] for v in tensors.values()) + pad_bytes
    wmap = {k: shard1 for k in tensors} | {pad_name: shard2}
    idx = dst / "model.safetensors.index.json"
    idx.write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": wmap}))
    files[idx.name] = idx
    return files
