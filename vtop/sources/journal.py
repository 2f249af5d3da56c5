"""Follow a systemd unit's (or a process's, or a container's) lines in the journal: ``journalctl -o
json -f`` run as a child process, its output read without ever waiting for it.

``journalctl -o json`` writes one JSON object per entry and line (systemd's ``journal-export``
field names): ``MESSAGE`` is the line's text (a string, or an array of byte values when it is not
valid UTF-8 or holds control characters), ``__REALTIME_TIMESTAMP`` the microseconds since the epoch
at which journald received it (the line's arrival), ``_PID``, ``_SYSTEMD_UNIT``... journald keeps
stdout a line per entry (a line over ``LineMax``, 48 KiB by default, is cut into several). The match
is ``_SYSTEMD_UNIT=vllm.service`` (``_SYSTEMD_USER_UNIT=`` for a user's), ``CONTAINER_ID_FULL=`` (docker's
``journald`` log driver), or ``_PID=`` as a last resort (a stdout stream is the PID that opened it).

``--since @<epoch>`` starts at the server's launch, so a start in progress is read whole and a server
up for days is not. The child's output is read like ``--log -`` (:class:`~vtop.sources.logtail.StreamTailer`:
only what ``poll`` says is there); starting it, and stopping it at :meth:`close` (TERM, then KILL
after a second), are bounded. A journalctl that is missing or exits says why, in the state's message.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
from collections.abc import Sequence

from vtop.sources.logtail import DEFAULT_MAX_LINE, DEFAULT_MAX_READ, LineSplitter, TailState

__all__ = ["JournalTailer", "decode_entry", "journal_command"]


def journal_command(match: str, since: float | None, exe: str = "journalctl") -> list[str]:
    """The ``journalctl`` command line that follows ``match`` (``FIELD=value``) from ``since``."""
    cmd = [exe, "--no-pager", "-o", "json", "-f", "--all"]
    if since is not None:
        cmd += ["--since", f"@{int(since)}"]
    else:
        cmd += ["-n", "1000"]
    return cmd + [match]


def decode_entry(line: bytes) -> tuple[bytes, float | None] | None:
    """``(MESSAGE bytes + newline, arrival epoch)`` of one ``journalctl -o json`` line; None when it
    is not one. An entry without a MESSAGE (a binary blob too large to show) is an empty piece."""
    try:
        obj = json.loads(line)
    except ValueError:
        return None
    if not isinstance(obj, dict):
        return None
    msg = obj.get("MESSAGE")
    if isinstance(msg, str):
        data = msg.encode("utf-8", "surrogatepass")
    elif isinstance(msg, list) and all(isinstance(b, int) and 0 <= b < 256 for b in msg):
        data = bytes(msg)
    else:
        data = b""
    t: float | None = None
    ts = obj.get("__REALTIME_TIMESTAMP")
    try:
        t = int(ts) / 1e6 if ts is not None else None
    except (TypeError, ValueError):
        t = None
    return data + b"\n" if data else b"", t


class JournalTailer:
    """A :class:`~vtop.sources.logtail.LogSource` over ``journalctl -o json -f MATCH``."""

    def __init__(self, match: str, *, since: float | None = None, label: str | None = None,
                 command: Sequence[str] | None = None, max_read: int = DEFAULT_MAX_READ,
                 max_line: int = DEFAULT_MAX_LINE) -> None:
        self.match = match
        self.label = label or f"journal {match}"
        self._cmd = list(command) if command is not None else journal_command(match, since)
        self._max_read = max_read
        self._splitter = LineSplitter(max_line)
        self._proc: subprocess.Popen[bytes] | None = None
        self._buf = b""
        self._offset = 0
        self._ended = False
        self._times: list[float | None] = []
        self._state = TailState("waiting", self.label, f"starting {' '.join(self._cmd[:1])} for {match}")

    @property
    def state(self) -> TailState:
        return self._state

    def _start(self) -> bool:
        exe = self._cmd[0]
        if os.sep not in exe and shutil.which(exe) is None:
            self._state = TailState("error", self.label, f"{exe} is not installed: the journal cannot be read "
                                    f"(pipe it: `journalctl -f -o cat {self.match} | vtop --log -`)")
            self._ended = True
            return False
        try:
            self._proc = subprocess.Popen(self._cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, close_fds=True)
        except OSError as e:
            self._state = TailState("error", self.label, f"cannot run {exe}: {e.strerror or e}")
            self._ended = True
            return False
        return True

    def poll(self) -> list[str]:
        return [line for line, _ in self.poll_timed()]

    def poll_timed(self) -> list[tuple[str, float | None]]:
        if self._ended:
            return []
        if self._proc is None and not self._start():
            return []
        proc = self._proc
        assert proc is not None and proc.stdout is not None
        out: list[tuple[str, float | None]] = []
        fd = proc.stdout.fileno()
        total = 0
        while total < self._max_read:
            r, _, _ = select.select([fd], [], [], 0)
            if not r:
                break
            data = os.read(fd, 65536)
            if not data:
                self._finish(out)
                return out
            total += len(data)
            self._offset += len(data)
            self._take(data, out)
        self._state = TailState("following", self.label, "", self._offset)
        return out

    def _take(self, data: bytes, out: list[tuple[str, float | None]]) -> None:
        buf = self._buf + data
        recs = buf.split(b"\n")
        self._buf = recs.pop()
        for rec in recs:
            if not rec.strip():
                continue
            got = decode_entry(rec)
            if got is None:
                continue
            payload, t = got
            out.extend((line, t) for line in self._splitter.feed(payload))

    def _finish(self, out: list[tuple[str, float | None]]) -> None:
        """journalctl exited: what it said on stderr is why."""
        self._ended = True
        out.extend((line, None) for line in self._splitter.flush())
        err = b""
        proc = self._proc
        if proc is not None and proc.stderr is not None:
            try:
                r, _, _ = select.select([proc.stderr.fileno()], [], [], 0)
                err = os.read(proc.stderr.fileno(), 4096) if r else b""
            except OSError:
                err = b""
        try:
            rc = proc.wait(timeout=1.0) if proc is not None else None
        except subprocess.TimeoutExpired:
            rc = None
        why = err.decode("utf-8", "replace").strip().splitlines()
        msg = f"journalctl exited ({rc}){': ' + why[-1] if why else ''}"
        self._state = TailState("error" if rc else "ended", self.label, msg, self._offset)

    def close(self) -> None:
        proc, self._proc = self._proc, None
        self._ended = True
        if proc is None:
            return
        try:
            proc.terminate()
            proc.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            proc.kill()
            try:
                proc.wait(timeout=1.0)
            except subprocess.TimeoutExpired:
                pass
        except OSError:
            pass
        for f in (proc.stdout, proc.stderr):
            if f is not None:
                try:
                    f.close()
                except OSError:
                    pass
