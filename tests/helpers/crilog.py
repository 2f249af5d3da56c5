"""A stand-in for the container runtime's CRI log writer: what containerd's CRI plugin does with a
container's stdout and stderr for the kubelet (``internal/cri/io/logger.go``, ``redirectLogs``),
byte for byte, in Python (used where no CRI runtime can run: this box has docker, no kubelet).

Per stream, it reads the pipe up to each ``\\n`` and writes one record a line::

    <time.Now() in RFC 3339 with nanoseconds, trailing zeros cut (Go's time.RFC3339Nano)> <stream> <tag> <text>\\n

* ``\\n`` (and a ``\\r`` right before it) is stripped from the text; the tag is ``F`` (full);
* a line longer than ``max_len`` (16 KiB, containerd's default ``max_container_log_line_size``)
  goes out as ``P`` (partial) records of ``max_len`` bytes, then the rest as ``F``;
* output that ends without a newline (the pipe closed) goes out as ``P``;
* the time is taken when the record is written, right after the line was read.

Both streams append to one file (containerd opens it once, O_APPEND, for both), each record in one
``write``. The kubelet's rotation (rename to ``0.log.<time>``, then the runtime reopens ``0.log``) is
:meth:`CriWriter.rotate`.

    python -m tests.helpers.crilog PATH -- COMMAND...   (runs COMMAND, writes its CRI log)
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from typing import BinaryIO

MAX_LEN = 16 * 1024


def rfc3339nano(t: float | None = None, ns: int | None = None) -> str:
    """Go's ``time.Now().Format(time.RFC3339Nano)`` in UTC: ``2026-12-04T20:29:58.4525849Z`` (nanoseconds,
    trailing zeros and then a bare dot removed)."""
    if ns is None:
        ns = time.time_ns() if t is None else int(t * 1e9)
    sec, frac = divmod(ns, 1_000_000_000)
    base = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(sec))
    f = f"{frac:09d}".rstrip("0")
    return f"{base}.{f}Z" if f else f"{base}Z"


class CriWriter:
    def __init__(self, path: str, max_len: int = MAX_LEN) -> None:
        self.path = path
        self.max_len = max_len
        self._lock = threading.Lock()
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o640)

    def record(self, stream: str, tag: str, text: bytes) -> None:
        rec = f"{rfc3339nano()} {stream} {tag} ".encode() + text + b"\n"
        with self._lock:
            os.write(self._fd, rec)

    def rotate(self, suffix: str | None = None) -> str:
        """The kubelet's rotation: the file renamed, the runtime reopens the path (ReopenContainerLog)."""
        with self._lock:
            old = f"{self.path}.{suffix or time.strftime('%Y%m%d-%H%M%S')}"
            os.rename(self.path, old)
            os.close(self._fd)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o640)
            return old

    def pump(self, pipe: BinaryIO, stream: str) -> None:
        """containerd's redirectLogs for one stream, until the pipe closes."""
        buf = b""
        while True:
            chunk = pipe.read1(65536) if hasattr(pipe, "read1") else pipe.read(65536)
            if not chunk:
                break
            buf += chunk
            while True:
                nl = buf.find(b"\n")
                if nl < 0:
                    while len(buf) > self.max_len:  # a line longer than the maximum: its pieces
                        self.record(stream, "P", buf[: self.max_len])
                        buf = buf[self.max_len:]
                    break
                line, buf = buf[:nl], buf[nl + 1:]
                if line.endswith(b"\r"):
                    line = line[:-1]
                while len(line) > self.max_len:
                    self.record(stream, "P", line[: self.max_len])
                    line = line[self.max_len:]
                self.record(stream, "F", line)
        if buf:
            self.record(stream, "P", buf)

    def close(self) -> None:
        with self._lock:
            os.close(self._fd)


def run(path: str, argv: list[str]) -> int:
    w = CriWriter(path)
    p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert p.stdout is not None and p.stderr is not None
    ts = [threading.Thread(target=w.pump, args=(p.stdout, "stdout")),
          threading.Thread(target=w.pump, args=(p.stderr, "stderr"))]
    for t in ts:
        t.start()
    rc = p.wait()
    for t in ts:
        t.join()
    w.close()
    return rc


if __name__ == "__main__":
    i = sys.argv.index("--")
    sys.exit(run(sys.argv[1], sys.argv[i + 1:]))
