"""Follow a vLLM log: a file that may be huge, absent, truncated or rotated, or a pipe.

No Textual and no threads here: vtop calls ``poll()`` from a thread worker, and
each call does a bounded amount of work (at most ``max_read`` bytes, 4 MiB by
default), so one poll never stalls the worker however far behind it is.

Why it is built this way:

* Like toolong, the file is opened unbuffered in binary and read with
  ``os.pread``; the last startup of a multi-GB log is found by scanning
  backwards from the end in chunks with ``rfind`` (capped), never by reading
  the file whole.
* Unlike toolong, it survives what vLLM logs go through: the file not existing
  yet, being truncated (``>`` on restart, copytruncate), or replaced (rotation,
  ``rm`` + restart), detected by comparing ``os.stat(path)`` with ``os.fstat(fd)``
  and a signature of the bytes just before the read offset.
* Lines come out as ``str`` with ANSI colour codes removed (vLLM ≤0.15 colours
  its process tag even in files), tqdm ``\\r`` redraws split into frames, the
  last frame of a bar split from a record glued after it, and a partial line
  held back until complete, except a partial that is a complete progress frame,
  which is passed on at once so progress shows live.
"""

from __future__ import annotations

import os
import re
import select
import stat
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, BinaryIO, Protocol

if TYPE_CHECKING:
    from vtop.sources.logformats import RecordDecoder

from vtop.model.logtext import banner_version, is_progress_frame, split_glued, strip_ansi

__all__ = [
    "DEFAULT_MAX_LINE",
    "DEFAULT_MAX_READ",
    "DEFAULT_MAX_SCAN",
    "LineSplitter",
    "LogLocation",
    "LogSource",
    "LogTailer",
    "StartupScan",
    "StreamTailer",
    "TailState",
    "find_last_startup",
    "find_log_for_pid",
    "log_written_by",
    "open_log",
]

DEFAULT_MAX_READ = 4 * 1024 * 1024  # bytes per poll
DEFAULT_MAX_SCAN = 64 * 1024 * 1024  # how far back the startup banner is looked for
DEFAULT_TAIL_BYTES = 1024 * 1024  # where to start when no banner is found
DEFAULT_MAX_LINE = 64 * 1024  # longer lines are cut (the engine config line is ~4 KB)
DEFAULT_BACKFILL_BYTES = 8 * 1024 * 1024  # the tail read for the log's history at attach
_READ_CHUNK = 1024 * 1024
_SCAN_CHUNK = 4 * 1024 * 1024
_SIG_LEN = 32

# Fixed byte strings every banner form contains ("vLLM API server version X" up to 0.12, "vLLM server
# version X, serving model M" or the logo's "version X" line since 0.13); candidates are then checked
# with the banner regexes (vtop/model/logtext.py, banner_version).
_BANNER_NEEDLES = (b"API server version ", b"vLLM server version ", b"  version ")
_TQDM_HINT_RE = re.compile(r"\d/\d+ \[")


# --------------------------------------------------------------------------- line splitting


_NULS = b"\x00" * 8
_NUL_RUN_RE = re.compile(rb"\x00{8,}")


class LineSplitter:
    """Incremental bytes -> lines, for both the file and the pipe tailer.

    ``\\n``, ``\\r\\n`` and a lone ``\\r`` (tqdm redraw) all end a line; empty
    lines are dropped. A partial last line is kept until it completes, except
    when it is a complete progress frame: then it is emitted at once and, when
    the line later completes, only what was added after it comes out (typically
    the record glued to the bar's last frame). Lines longer than ``max_line``
    bytes are cut and end with `` …``.
    """

    def __init__(self, max_line: int = DEFAULT_MAX_LINE) -> None:
        self._max = max_line
        #: NUL bytes dropped (runs of 8 or more: a sparse or preallocated file, the hole a writer leaves
        #: after logrotate's copytruncate); never reset, the log's problem line says it
        self.nul_bytes = 0
        self._buf = b""
        self._flushed = 0  # bytes at the start of _buf already emitted as a live frame
        self._skipping = False  # dropping the rest of an over-long line

    def reset(self) -> None:
        self._buf = b""
        self._flushed = 0
        self._skipping = False

    @property
    def pending(self) -> int:
        """Bytes held back as an incomplete line."""
        return len(self._buf)

    def feed(self, data: bytes) -> list[str]:
        out: list[str] = []
        buf = self._buf + data if self._buf else data
        if _NULS in buf:  # no line of them, no row of replacement characters: counted and dropped
            n = len(buf)
            buf = _NUL_RUN_RE.sub(b"", buf)
            self.nul_bytes += n - len(buf)
        parts = buf.replace(b"\r", b"\n").split(b"\n")
        partial = parts.pop()
        if parts:
            if self._skipping:
                self._skipping = False
                parts[0] = b""
            elif self._flushed:
                rest = parts[0][self._flushed :]
                parts[0] = rest if rest.strip() else b""
                self._flushed = 0
            self._emit_many(parts, out)
        elif self._skipping:
            self._buf = b""
            return out
        if len(partial) > self._max:
            if self._flushed:
                partial = partial[self._flushed :]
                self._flushed = 0
            self._emit_many([partial], out)
            self._buf = b""
            self._skipping = True
            return out
        self._buf = partial
        if partial and not self._flushed:
            text = strip_ansi(partial.decode("utf-8", "replace"))
            if is_progress_frame(text):
                pieces = split_glued(text)
                # A record glued after the frame may itself end in "n/m [a<b]" while it is
                # still being written: emitting it now would cut it in two. Wait for its
                # newline then (the frame comes out with it); found by hypothesis.
                if len(pieces) == 1:
                    out.extend(pieces)
                    self._flushed = len(partial)
        return out

    def flush(self) -> list[str]:
        """Emit the held partial line (end of input) and start clean."""
        out: list[str] = []
        rest = self._buf[self._flushed :]
        if rest.strip() and not self._skipping:
            self._emit_many([rest], out)
        self.reset()
        return out

    def _emit_many(self, parts: list[bytes], out: list[str]) -> None:
        """Decode, clean and split many complete lines at once (one decode, one ANSI pass)."""
        mx = self._max
        parts = [p if len(p) <= mx else p[:mx] + " …".encode() for p in parts if p]
        if not parts:
            return
        text = strip_ansi(b"\n".join(parts).decode("utf-8", "replace"))
        lines = text.split("\n")
        if "]" in text and _TQDM_HINT_RE.search(text):
            for line in lines:
                if line:
                    out.extend(split_glued(line))
        else:
            out.extend(line for line in lines if line)


# --------------------------------------------------------------------------- backward banner scan


@dataclass(frozen=True)
class StartupScan:
    """Where the last startup begins in a file, as found by :func:`find_last_startup`."""

    offset: int  # first byte to read
    found: bool  # a banner was found (else ``offset`` is a line start near the end)
    version: str | None
    scanned: int  # bytes looked at


def _line_bounds(fd: int, pos: int, size: int) -> tuple[int, bytes]:
    """(start offset, bytes) of the line holding ``pos``, looking at most 64 KiB each way."""
    back = min(pos, 65536)
    before = os.pread(fd, back, pos - back)
    nl = max(before.rfind(b"\n"), before.rfind(b"\r"))
    start = pos - back + nl + 1 if nl >= 0 else pos - back
    after = os.pread(fd, min(65536, size - pos), pos)
    end_rel = min((i for i in (after.find(b"\n"), after.find(b"\r")) if i >= 0), default=len(after))
    return start, before[nl + 1 :] + after[:end_rel] if nl >= 0 else before + after[:end_rel]


def _header(line: bytes) -> bytes | None:
    """The record header up to the source bracket, e.g. ``(APIServer pid=9) INFO 11-30 09:54:35 [api_utils.py:345]``."""
    i = line.find(b".py:")
    j = line.find(b"]", i)
    return line[: j + 1] if i > 0 and j > 0 else None


def _logo_start(fd: int, start: int, line: bytes, unwrap: Callable[[bytes], bytes] | None = None) -> int:
    """Back up over the two logo lines above the version line (0.13+), which share its header."""
    head = _header(unwrap(line) if unwrap else line)
    if head is None or start == 0:
        return start
    back = min(start, 4096)
    lines = os.pread(fd, back, start - back).split(b"\n")
    if lines[-1] != b"":
        return start
    lines.pop()
    if start - back > 0:
        lines = lines[1:]  # the first one may be cut
    pos = start
    for prev in reversed(lines[-2:]):
        if _header(unwrap(prev) if unwrap else prev.rstrip(b"\r")) != head:
            break
        pos -= len(prev) + 1
    return pos


def find_last_startup(
    fd: int,
    size: int | None = None,
    *,
    max_scan: int = DEFAULT_MAX_SCAN,
    tail_bytes: int = DEFAULT_TAIL_BYTES,
    chunk: int = _SCAN_CHUNK,
    unwrap: Callable[[bytes], bytes] | None = None,
) -> StartupScan:
    """Find the last vLLM startup banner by scanning backwards from the end.

    Reads ``chunk``-sized windows with ``os.pread`` and ``rfind`` for fixed
    needles, checks each candidate line with the banner regexes, and stops at the
    first real banner, so the cost is proportional to what follows the last
    start, capped at ``max_scan`` bytes. With no banner in reach, returns the start
    of the first whole line within the last ``tail_bytes``. ``unwrap`` turns a line of the file
    into the process's text (a container runtime's record: :mod:`vtop.sources.logformats`).
    """
    if size is None:
        size = os.fstat(fd).st_size
    lo_limit = max(0, size - max_scan)
    longest = max(len(n) for n in _BANNER_NEEDLES)
    hi = size
    scanned = 0
    while hi > lo_limit:
        lo = max(lo_limit, hi - chunk)
        data = os.pread(fd, min(size, hi + longest) - lo, lo)
        scanned += hi - lo
        limit = hi - lo  # only matches starting before `hi` are new in this window
        while True:
            best = -1
            for needle in _BANNER_NEEDLES:
                best = max(best, data.rfind(needle, 0, limit + len(needle) - 1))
            if best < 0:
                break
            start, line = _line_bounds(fd, lo + best, size)
            version = banner_version((unwrap(line) if unwrap else line).decode("utf-8", "replace"))
            if version is not None:
                return StartupScan(_logo_start(fd, start, line, unwrap), True, version, scanned)
            limit = best
        hi = lo
    if size <= tail_bytes:
        return StartupScan(0, False, None, scanned)
    base = size - tail_bytes
    window = os.pread(fd, min(tail_bytes, 65536), base)
    nl = window.find(b"\n")
    return StartupScan(base + nl + 1 if nl >= 0 else base, False, None, scanned)


# --------------------------------------------------------------------------- tailers


@dataclass(frozen=True)
class TailState:
    """What a tailer is doing, for the status bar."""

    status: str  # "waiting" | "following" | "ended" | "error"
    source: str  # the path, or "-" for stdin
    message: str = ""
    offset: int = 0
    size: int | None = None
    restarts: int = 0  # truncations and rotations seen
    startup_found: bool | None = None  # whether the attach scan found a banner
    #: when the file was last written (its modification time, wall clock), once every byte of it
    #: was read; None for a pipe, or while catching up. A backlog's last line may be a tqdm frame,
    #: which carries no time stamp: this says how long ago it was written.
    mtime: float | None = None
    #: NUL bytes read and dropped (runs of them: a sparse or preallocated file, a copytruncate hole)
    nul_bytes: int = 0

    @property
    def behind(self) -> int:
        """Bytes written but not read yet (catching up after attach)."""
        return max(0, self.size - self.offset) if self.size is not None else 0


class LogSource(Protocol):
    """What vtop needs from a log source."""

    def poll(self) -> list[str]: ...

    @property
    def state(self) -> TailState: ...

    # optional: ``poll_timed() -> list[tuple[str, float | None]]``, each line with the wall-clock
    # time its writer stamped on it when it read it (a container runtime's log, journald)

    def close(self) -> None: ...


class LogTailer:
    """Follow a log file by path.

    The first poll opens the file and, when it already exists, jumps to the last
    startup (see :func:`find_last_startup`); a file that appears later, or a new
    file after rotation, is read from its start. Every poll checks for
    truncation and replacement.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        jump_to_last_startup: bool = True,
        max_read: int = DEFAULT_MAX_READ,
        max_scan: int = DEFAULT_MAX_SCAN,
        tail_bytes: int = DEFAULT_TAIL_BYTES,
        max_line: int = DEFAULT_MAX_LINE,
        decoder: RecordDecoder | None = None,
        label: str | None = None,
    ) -> None:
        self.path = os.fspath(path)
        #: a container runtime's records around the process's bytes (:mod:`vtop.sources.logformats`)
        self.decoder = decoder
        #: what the file is, for the screen ("docker json-file of vllm-0"); None: a plain log file
        self.label = label
        self._times: list[float | None] = []
        self._rotating = False
        self._jump = jump_to_last_startup
        self._max_read = max_read
        self._max_scan = max_scan
        self._tail_bytes = tail_bytes
        self._splitter = LineSplitter(max_line)
        self._file: BinaryIO | None = None
        self._ident: tuple[int, int] | None = None  # (st_dev, st_ino) of the open file
        self._offset = 0
        self._sig = b""
        self._from_start = not jump_to_last_startup
        self._restarts = 0
        self._scan: StartupScan | None = None
        self._state = TailState("waiting", self.path, f"waiting for {self.path}")

    @property
    def state(self) -> TailState:
        return self._state

    @property
    def scan(self) -> StartupScan | None:
        """The attach scan's result, once the file was opened."""
        return self._scan

    def close(self) -> None:
        if self._file is not None:
            try:
                self._file.close()
            finally:
                self._file = None

    def tail_lines(self, needles: tuple[bytes, ...], max_bytes: int = DEFAULT_BACKFILL_BYTES, *,
                   before_start: bool = False) -> list[str]:
        """The lines holding one of ``needles`` in the last ``max_bytes`` of the open file
        that the forward read has not reached yet, oldest first (ANSI removed). For the log's
        history at attach (:mod:`vtop.core.loghistory`): the forward read starts at the last
        startup, which on a server up for days is up to ``max_scan`` back and takes a poll
        per ``max_read`` to come; the stats lines of the last minutes are at the end. Bounded:
        one ``pread`` of at most ``max_bytes``, never the file whole. ``before_start``: the lines
        before where the forward read began count too (the stats lines of an earlier run of a
        server restarted in place, written before its last startup: issue #45)."""
        if self._file is None:
            return []
        fd = self._file.fileno()
        try:
            size = os.fstat(fd).st_size
            start = max(0 if before_start else self._offset, size - max_bytes)
            if start >= size:
                return []
            data = os.pread(fd, size - start, start)
        except OSError:
            return []
        data = data.replace(b"\r", b"\n")
        first = data.find(b"\n") + 1 if start > 0 else 0  # the first line may be cut
        last = data.rfind(b"\n")  # and the last one still being written
        if last < first:
            return []
        bounds: set[tuple[int, int]] = set()
        for needle in needles:  # bytes.find, not a loop over every line: 8 MiB in a few ms
            i = data.find(needle, first, last)
            while i >= 0:
                a = data.rfind(b"\n", first, i) + 1 or first
                b = data.find(b"\n", i, last + 1)
                bounds.add((a, b))
                i = data.find(needle, b, last)
        out: list[str] = []
        dec = self.decoder
        for a, b in sorted(bounds):
            raw = data[a:b] if dec is None else b"".join(dec.unwrap(r) + b"\n" for r in data[a:b].split(b"\n"))
            for text in strip_ansi(raw.decode("utf-8", "replace")).split("\n"):
                if text:
                    out.extend(split_glued(text))
        return out

    def poll(self) -> list[str]:
        """New complete lines since the last poll (at most ``max_read`` bytes' worth)."""
        self._times = []
        try:
            return self._poll()
        except OSError as exc:
            self.close()
            self._set("error", f"cannot read {self.path}: {exc.strerror or exc}")
            return []

    def poll_timed(self) -> list[tuple[str, float | None]]:
        """:meth:`poll` with each line's time as its writer stamped it (a runtime's record: when it
        read the line from the process; None for a plain file, whose lines carry none)."""
        lines = self.poll()
        times = self._times if len(self._times) == len(lines) else [None] * len(lines)
        return list(zip(lines, times))

    # -- internals

    def _set(self, status: str, message: str = "", size: int | None = None, mtime: float | None = None) -> None:
        self._state = TailState(
            status,
            self.path,
            message,
            self._offset,
            size,
            self._restarts,
            self._scan.found if self._scan is not None else None,
            mtime,
            self._splitter.nul_bytes,
        )

    def _open(self) -> bool:
        try:
            # O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer.
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        except FileNotFoundError:
            self._from_start = True  # it will be a new file: read it whole
            self._set("waiting", f"waiting for {self.path} to appear")
            return False
        except PermissionError:
            self._set("error", f"cannot read {self.path}: permission denied (vtop runs as uid {os.getuid()}; "
                               "run it as the user that writes the log, or make the file readable)")
            return False
        except OSError as exc:
            self._set("error", f"cannot open {self.path}: {exc.strerror or exc}")
            return False
        try:
            return self._adopt(fd)
        except BaseException:
            os.close(fd)
            raise

    def _adopt(self, fd: int) -> bool:
        """Check and position a freshly opened descriptor; False (fd closed) if it is not a file."""
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            os.close(fd)
            self._set("error", f"{self.path} is a directory, not a log file")
            return False
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            self._set("error", f"{self.path} is not a regular file; for a pipe or a FIFO use --log - (stdin)")
            return False
        ident = (st.st_dev, st.st_ino)
        if ident == self._ident and st.st_size >= self._offset:
            pass  # reopened after an error: resume where we were
        elif self._ident is None and not self._from_start:
            unwrap = self.decoder.unwrap if self.decoder is not None else None
            self._scan = find_last_startup(fd, st.st_size, max_scan=self._max_scan, tail_bytes=self._tail_bytes,
                                           unwrap=unwrap)
            if not self._scan.found and self.decoder is not None:
                # A runtime's file rotated since the start: begin in the rotated file that holds it, go on in
                # this one as after any rotation (the next poll sees the path is another file)
                fd, st = self._from_rotated(fd, st)
                ident = (st.st_dev, st.st_ino)
            self._offset = self._scan.offset
            self._reset_decoding()
            back = min(_SIG_LEN, self._offset)
            self._sig = os.pread(fd, back, self._offset - back) if back else b""
        else:
            self._offset = 0
            self._sig = b""
            if self._rotating and self.decoder is not None:
                self.decoder.reset()  # the process's stream goes on in the new file: keep its partial line
            else:
                self._reset_decoding()
        f = open(fd, "rb", buffering=0)  # noqa: SIM115 - unbuffered, kept open across polls
        self._file, self._ident = f, ident
        return True

    def rotated_sibling(self) -> str | None:
        """The newest rotated copy of the file beside it: docker's ``ID-json.log.1``, the kubelet's
        ``0.log.20261204-201500`` (compressed ones left out); None when there is none."""
        folder, base = os.path.split(self.path)
        numbered: list[tuple[int, str]] = []  # docker: .1 is the newest
        stamped: list[tuple[str, str]] = []  # the kubelet: the latest time is the newest
        try:
            for e in os.scandir(folder or "."):
                suffix = e.name[len(base) + 1:] if e.name.startswith(base + ".") else ""
                if suffix.isdigit():
                    numbered.append((int(suffix), e.path))
                elif re.fullmatch(r"\d{8}-\d{6}", suffix):
                    stamped.append((suffix, e.path))
        except OSError:
            return None
        if numbered:
            return min(numbered)[1]
        return max(stamped)[1] if stamped else None

    def _from_rotated(self, fd: int, st: os.stat_result) -> tuple[int, os.stat_result]:
        """``(fd, stat)`` of the rotated copy holding the last startup, positioned by ``self._scan``; the
        file given back unchanged when none holds it."""
        sib = self.rotated_sibling()
        if sib is None:
            return fd, st
        try:
            sfd = os.open(sib, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except OSError:
            return fd, st
        sst = os.fstat(sfd)
        assert self.decoder is not None
        scan = find_last_startup(sfd, sst.st_size, max_scan=self._max_scan, tail_bytes=self._tail_bytes,
                                 unwrap=self.decoder.unwrap)
        if not scan.found:
            os.close(sfd)
            return fd, st
        os.close(fd)
        self._scan = scan
        return sfd, sst

    def _sig_ok(self, fd: int) -> bool:
        if not self._sig:
            return True
        n = len(self._sig)
        return os.pread(fd, n, self._offset - n) == self._sig

    def _reset_decoding(self) -> None:
        self._splitter.reset()
        if self.decoder is not None:
            self.decoder.reset()

    def _feed(self, chunk: bytes) -> list[str]:
        """Bytes of the file -> lines (through the runtime's records, each line timed, when there are)."""
        dec = self.decoder
        if dec is None:
            return self._splitter.feed(chunk)
        out: list[str] = []
        for payload, t in dec.feed(chunk):
            lines = self._splitter.feed(payload)
            out.extend(lines)
            self._times.extend([t] * len(lines))
        return out

    def _flush(self) -> list[str]:
        """The end of a file (rotated away): its last record and partial line."""
        out = []
        if self.decoder is not None:
            for payload, t in self.decoder.flush():
                lines = self._splitter.feed(payload)
                out.extend(lines)
                self._times.extend([t] * len(lines))
            return out  # a runtime's file: the stream goes on in the next one, partial line and all
        return self._splitter.flush()

    def _read(self, fd: int, budget: int) -> tuple[int, list[str]]:
        total = 0
        out: list[str] = []
        while total < budget:
            chunk = os.pread(fd, min(_READ_CHUNK, budget - total), self._offset)
            if not chunk:
                break
            self._offset += len(chunk)
            total += len(chunk)
            self._sig = chunk[-_SIG_LEN:] if len(chunk) >= _SIG_LEN else (self._sig + chunk)[-_SIG_LEN:]
            out.extend(self._feed(chunk))
        return total, out

    def _poll(self) -> list[str]:
        if self._file is None and not self._open():
            return []
        assert self._file is not None
        fd = self._file.fileno()
        out: list[str] = []
        budget = self._max_read
        message = ""
        try:
            st_path: os.stat_result | None = os.stat(self.path)
        except FileNotFoundError:
            st_path = None
        st_fd = os.fstat(fd)
        if st_path is not None and (st_path.st_dev, st_path.st_ino) != self._ident:
            # Replaced (rotation, or removed and recreated): finish the old file first.
            used, lines = self._read(fd, budget)
            out.extend(lines)
            budget -= used
            if self._offset < os.fstat(fd).st_size:
                self._set("following", "log file replaced; finishing the old one", st_fd.st_size)
                return out
            out.extend(self._flush())
            self.close()
            self._restarts += 1
            self._from_start = True
            self._rotating = True
            try:
                opened = self._open()
            finally:
                self._rotating = False
            if not opened:
                return out
            assert self._file is not None
            fd = self._file.fileno()
            st_fd = os.fstat(fd)
            message = "log file replaced; reading the new one from its start"
        if st_fd.st_size < self._offset or not self._sig_ok(fd):
            self._offset = 0
            self._sig = b""
            self._reset_decoding()
            self._restarts += 1
            message = "log file truncated; reading it again from its start"
        _, lines = self._read(fd, budget)
        out.extend(lines)
        if st_path is None:
            message = message or f"{self.path} was removed; still reading the open file"
        elif not message and self._state.status == "following":
            message = self._state.message if self._state.offset == self._offset else ""
        st_end = os.fstat(fd)
        caught_up = st_end.st_size <= self._offset
        self._set("following", message, max(st_end.st_size, self._offset), st_end.st_mtime if caught_up else None)
        return out


class StreamTailer:
    """Follow a non-seekable stream (``--log -``: ``docker logs -f c 2>&1 | vtop --log -``).

    Reads with ``os.read`` only what ``poll``/``select`` says is there, so a poll
    never blocks, without setting ``O_NONBLOCK`` on a descriptor the terminal
    may share. At end of input the last partial line is emitted and the state
    becomes ``ended``.
    """

    def __init__(
        self,
        fd: int,
        *,
        name: str = "-",
        max_read: int = DEFAULT_MAX_READ,
        max_line: int = DEFAULT_MAX_LINE,
        read_chunk: int = 65536,
    ) -> None:
        self._fd = fd
        self._name = name
        self._max_read = max_read
        self._chunk = read_chunk
        self._splitter = LineSplitter(max_line)
        self._offset = 0
        self._ended = False
        self._poller = select.poll() if hasattr(select, "poll") else None
        if self._poller is not None:
            self._poller.register(fd, select.POLLIN | select.POLLPRI)
        self._state = TailState("following", name, "reading standard input" if name == "-" else "")

    @property
    def state(self) -> TailState:
        return self._state

    def close(self) -> None:
        if self._poller is not None:
            try:
                self._poller.unregister(self._fd)
            except (KeyError, ValueError, OSError):
                pass
            self._poller = None

    def _readable(self) -> bool:
        if self._poller is not None:
            return bool(self._poller.poll(0))
        r, _, _ = select.select([self._fd], [], [], 0)
        return bool(r)

    def poll(self) -> list[str]:
        if self._ended or self._state.status == "error":
            return []
        out: list[str] = []
        total = 0
        while total < self._max_read:
            try:
                if not self._readable():
                    break
                data = os.read(self._fd, min(self._chunk, self._max_read - total))
            except BlockingIOError:
                break
            except (OSError, ValueError) as exc:
                self._state = TailState("error", self._name, f"cannot read input: {exc}", self._offset)
                break
            if not data:
                out.extend(self._splitter.flush())
                self._ended = True
                self._state = TailState("ended", self._name, "input ended (the writer closed it)", self._offset)
                break
            total += len(data)
            self._offset += len(data)
            out.extend(self._splitter.feed(data))
        if not self._ended and self._state.status != "error":
            self._state = TailState("following", self._name, self._state.message, self._offset,
                                    nul_bytes=self._splitter.nul_bytes)
        return out


def open_log(spec: str, *, stdin_fd: int = 0, **kwargs: int | bool) -> LogTailer | StreamTailer:
    """``--log`` argument to a source: ``-`` is standard input (fd 0), anything else a path.

    The CLI must give Textual the terminal (``/dev/tty``) for keys when stdin is the log.
    """
    if spec == "-":
        keep = {k: v for k, v in kwargs.items() if k in ("max_read", "max_line")}
        return StreamTailer(stdin_fd, **keep)  # type: ignore[arg-type]
    return LogTailer(spec, **kwargs)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- log of a pid


@dataclass(frozen=True)
class LogLocation:
    """Where a process's log goes, from ``/proc/PID/fd/1`` and ``/2``."""

    pid: int
    path: str | None  # a regular file vtop can follow, else None
    stream: str | None  # "stdout" or "stderr": which one ``path`` is
    target: str | None  # what stdout points to (readlink), for messages
    message: str  # why there is no path and what to do, or a note


def _describe(pid: int, stream: str, target: str) -> str:
    if target.startswith("pipe:"):
        return (
            f"vLLM (pid {pid}) writes its {stream} to a pipe, so there is no file to follow. Pipe it into vtop: "
            "`docker logs -f CONTAINER 2>&1 | vtop --log -` or `journalctl -f -o cat -u UNIT | vtop --log -`, "
            "or start vLLM with `2>&1 | tee vllm.log` and pass `--log vllm.log`."
        )
    if target.startswith("socket:"):
        return (
            f"vLLM (pid {pid}) writes its {stream} to a socket (systemd journal or a container runtime). Pipe it in: "
            f"`journalctl -f -o cat _PID={pid} | vtop --log -` or `docker logs -f CONTAINER 2>&1 | vtop --log -`, "
            "or pass `--log PATH` if it also goes to a file."
        )
    if target.startswith(("/dev/pts/", "/dev/tty")) or target == "/dev/console":
        return (
            f"vLLM (pid {pid}) writes to a terminal ({target}), which vtop cannot read. Start it with "
            "`vllm serve ... 2>&1 | tee vllm.log` and pass `--log vllm.log` (or pipe it: `--log -`)."
        )
    if target == "/dev/null":
        return (
            f"vLLM (pid {pid}) discards its output (/dev/null). Start it with `> vllm.log 2>&1` "
            "and pass `--log vllm.log`."
        )
    return (
        f"vLLM (pid {pid}) writes its {stream} to {target}, which is not a regular file. "
        "Pass `--log PATH` (or `--log -` to read a pipe)."
    )


def log_written_by(pid: int, path: str, *, proc_root: str = "/proc") -> bool | None:
    """Whether process ``pid`` writes the file ``path`` on its stdout or stderr (the same
    file, not the same name: ``/proc/PID/fd/1`` and ``/2`` against ``path``'s device and
    inode). None when it cannot be told: the file or the process's fds cannot be read."""
    try:
        want = os.stat(path)
    except OSError:
        return None
    readable = False
    for fdnum in (1, 2):
        try:
            st = os.stat(f"{proc_root}/{pid}/fd/{fdnum}")
        except OSError:
            continue
        readable = True
        if (st.st_dev, st.st_ino) == (want.st_dev, want.st_ino):
            return True
    return False if readable else None


def find_log_for_pid(pid: int, *, proc_root: str = "/proc") -> LogLocation:
    """Find the log file a process writes to, or say clearly why there is none.

    Reads the links ``/proc/PID/fd/1`` and ``/2`` (stdout first: vLLM's records go
    there; tqdm bars go to stderr). A regular file gives its path; a file deleted
    while open is still readable through the ``/proc`` link itself.
    """
    first_target: str | None = None
    first_stream: str | None = None
    for fdnum, stream in ((1, "stdout"), (2, "stderr")):
        link = f"{proc_root}/{pid}/fd/{fdnum}"
        try:
            target = os.readlink(link)
        except FileNotFoundError:
            if not os.path.exists(f"{proc_root}/{pid}"):
                return LogLocation(pid, None, None, None, f"no process {pid} (it has exited?)")
            continue
        except PermissionError:
            return LogLocation(
                pid,
                None,
                None,
                None,
                f"not allowed to read {proc_root}/{pid}/fd: vLLM runs as another user. Run vtop as that user "
                "(or with sudo), or pass `--log PATH` / `--log -`.",
            )
        except OSError as exc:
            return LogLocation(pid, None, None, None, f"cannot read {link}: {exc.strerror or exc}")
        if first_target is None:
            first_target, first_stream = target, stream
        if target.endswith(" (deleted)"):
            return LogLocation(
                pid,
                link,
                stream,
                target,
                f"the log file {target[: -len(' (deleted)')]} was deleted; reading it via {link}",
            )
        if target.startswith("/"):
            try:
                st = os.stat(link)
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                note = "" if stream == "stdout" else "stdout is not a file; following stderr"
                return LogLocation(pid, target, stream, target, note)
    if first_target is None:
        return LogLocation(pid, None, None, None, f"process {pid} has no stdout or stderr open")
    assert first_stream is not None
    return LogLocation(pid, None, None, first_target, _describe(pid, first_stream, first_target))
