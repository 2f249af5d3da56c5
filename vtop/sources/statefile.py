"""vtop's state files, JSON under ``$XDG_STATE_HOME/vtop/`` (default ``~/.local/state/vtop/``): the starts'
history (issue 40: ``starts.json``, what it holds is :mod:`vtop.core.start_history`'s; the monitor parses it).

Small and bounded (a few KB: the core keeps 8 starts of 32 keys), 0600 in a 0700 directory, written
atomically (a temporary file in the same directory, fsynced, renamed over the old one: a crash leaves
the old file or the new one, never half of one). A file that cannot be read or parsed is never fatal:
:func:`load_json` returns None and one line saying why, and the next write replaces it.
The caller runs these in a thread (a home on a network filesystem may hang).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["MAX_BYTES", "history_path", "load_json", "save_json", "state_path"]

#: a file larger than this is not what vtop wrote: ignored
MAX_BYTES = 1 << 20


def state_path(name: str, env: Mapping[str, str] | None = None) -> Path:
    """``$XDG_STATE_HOME/vtop/NAME`` (an XDG_STATE_HOME that is not an absolute path is ignored, as the XDG
    spec says)."""
    e = os.environ if env is None else env
    base = e.get("XDG_STATE_HOME") or ""
    root = Path(base) if os.path.isabs(base) else Path(e.get("HOME") or os.path.expanduser("~")) / ".local" / "state"
    return root / "vtop" / name


def history_path(env: Mapping[str, str] | None = None) -> Path:
    """Where the starts' history lives."""
    return state_path("starts.json", env)


def load_json(path: Path, what: str = "start history") -> tuple[Any, str | None]:
    """(the JSON value, None), or (None, None) for a missing file (the first write makes it), or (None, the
    line that says why the file was ignored)."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_BYTES + 1)
    except FileNotFoundError:
        return None, None
    except OSError as e:
        return None, f"{what} {path}: cannot read it ({e.strerror or e}); going on without it"
    if len(data) > MAX_BYTES:
        return None, f"{what} {path}: larger than {MAX_BYTES // 1024} KB, not vtop's; ignored"
    try:
        return json.loads(data.decode("utf-8")), None
    except (ValueError, UnicodeDecodeError) as e:
        return None, f"{what} {path}: unreadable ({str(e)[:120]}); ignored, the next write replaces it"


def save_json(path: Path, obj: Any, what: str = "start history") -> str | None:
    """Write ``obj`` as JSON atomically, 0600; None, or the line that says why it could not be written."""
    import tempfile  # a write only (reading the file is every start's; tempfile brings random and hashlib)

    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".starts.", suffix=".tmp", dir=path.parent)
        try:
            os.fchmod(fd, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(obj, f, separators=(",", ":"))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
    except OSError as e:
        return f"{what} {path}: cannot write it ({e.strerror or e})"
    return None
