"""The Hugging Face Hub's cache as a vLLM server process sees it: one repo's download, by stat.

Where the cache is (huggingface_hub's own order): ``HF_HUB_CACHE``, else ``$HF_HOME/hub``, else
``$XDG_CACHE_HOME/huggingface/hub``, else ``~/.cache/huggingface/hub`` -- read from the server's
``/proc/PID/environ`` where vtop may (same user, or root), else from vtop's own environment and
home (said as ``default``). A repo ``org/name`` lives in ``models--org--name/``: ``blobs/<etag>``
(``<etag>.incomplete`` while it downloads), ``snapshots/<commit>/<file>`` links into ``blobs``.

The cost is one ``stat`` per blob and per snapshot file, and one read of the repo's
``model.safetensors.index.json`` when it changes; the scan stops at its deadline and says so.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from vtop.model.download import CacheScan

#: the files that are weights (vLLM's allow patterns)
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
INDEX_NAME = "model.safetensors.index.json"


def read_environ(pid: int) -> dict[str, str] | None:
    """The environment a process started with, or None where it cannot be read."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    out: dict[str, str] = {}
    for item in raw.split(b"\0"):
        k, sep, v = item.partition(b"=")
        if sep:
            out[k.decode(errors="replace")] = v.decode(errors="replace")
    return out


def hub_cache_dir(env: dict[str, str] | None) -> tuple[str, str]:
    """(the hub cache folder, ``environ`` or ``default``) for a process environment (None: unreadable)."""
    src = "environ" if env is not None else "default"
    e = env if env is not None else dict(os.environ)
    if e.get("HF_HUB_CACHE"):
        return os.path.expanduser(e["HF_HUB_CACHE"]), src
    if e.get("HUGGINGFACE_HUB_CACHE"):
        return os.path.expanduser(e["HUGGINGFACE_HUB_CACHE"]), src
    if e.get("HF_HOME"):
        return os.path.join(os.path.expanduser(e["HF_HOME"]), "hub"), src
    home = e.get("HOME") or os.path.expanduser("~")
    xdg = e.get("XDG_CACHE_HOME") or os.path.join(home, ".cache")
    return os.path.join(xdg, "huggingface", "hub"), src


def is_repo_id(model: str | None) -> bool:
    """``org/name`` or ``name`` that is not a folder on this box: something the Hub would serve."""
    if not model or model.startswith(("/", ".", "~")) or model.count("/") > 1:
        return False
    return not os.path.isdir(model)


def repo_folder(cache_dir: str, repo: str) -> Path:
    return Path(cache_dir) / ("models--" + repo.replace("/", "--"))


def _index(snapshots: Path, cache: dict[str, tuple[float, int | None, int | None]]) -> tuple[int | None, int | None]:
    """(total_size, number of shards) of the repo's index, from any snapshot; read again when it changed."""
    try:
        revs = list(snapshots.iterdir())
    except OSError:
        return None, None
    for rev in revs:
        p = rev / INDEX_NAME
        try:
            mtime = p.stat().st_mtime
        except OSError:
            continue
        key = str(p)
        hit = cache.get(key)
        if hit is not None and hit[0] == mtime:
            return hit[1], hit[2]
        try:
            doc = json.loads(p.read_text())
            total = doc.get("metadata", {}).get("total_size")
            files = len(set(doc.get("weight_map", {}).values())) or None
            total = int(total) if total is not None else None
        except (OSError, ValueError, TypeError, AttributeError):
            total = files = None
        cache[key] = (mtime, total, files)
        return total, files
    return None, None


class HubCacheScanner:
    """Scans one repo's folder; keeps what it read of the index between scans."""

    def __init__(self) -> None:
        self._index: dict[str, tuple[float, int | None, int | None]] = {}

    def scan(self, pid: int | None, repo: str, *, deadline_s: float = 1.0, mono: float | None = None) -> CacheScan:
        env = read_environ(pid) if pid is not None else None
        cache_dir, src = hub_cache_dir(env)
        t = time.monotonic() if mono is None else mono
        stop = time.monotonic() + deadline_s
        folder = repo_folder(cache_dir, repo)
        if not folder.is_dir():
            return CacheScan(t, repo, cache_dir, src, error=f"{folder} not there (yet)")
        incomplete: dict[str, int] = {}
        cut = False
        try:
            blobs = list(os.scandir(folder / "blobs"))
        except OSError:
            blobs = []
        for b in blobs:
            if time.monotonic() > stop:
                cut = True
                break
            if b.name.endswith(".incomplete"):
                try:
                    incomplete[b.name] = b.stat().st_size
                except OSError:
                    continue
        done_bytes = done_files = 0
        seen: set[str] = set()
        snaps = folder / "snapshots"
        try:
            for rev in os.scandir(snaps):
                for dirpath, _dirs, files in os.walk(rev.path):
                    for name in files:
                        if time.monotonic() > stop:
                            cut = True
                            break
                        if not name.endswith(WEIGHT_SUFFIXES):
                            continue
                        p = os.path.join(dirpath, name)
                        try:
                            real = os.path.realpath(p)
                            size = os.stat(real).st_size
                        except OSError:
                            continue
                        if real not in seen:
                            seen.add(real)
                            done_bytes += size
                            done_files += 1
        except OSError:
            pass
        total, nfiles = _index(snaps, self._index)
        return CacheScan(t, repo, cache_dir, src, incomplete, done_bytes, done_files, total, nfiles,
                         repo_seen=True, cut=cut)
