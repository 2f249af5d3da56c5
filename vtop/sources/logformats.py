"""The files container runtimes write a process's stdout and stderr to, decoded back to its bytes
with the time the runtime stamped on each piece (the time it read it from the pipe: the line's
arrival, on the wall clock).

docker's ``json-file`` driver (moby ``daemon/logger/jsonfilelog``: ``jsonlog.JSONLogs.MarshalJSONBuf``
writes one object a line, keys in this order: ``{"log":"<the bytes, JSON-escaped>","stream":"stdout",
"attrs":{...},"time":"<RFC 3339, nanoseconds, UTC>"}\\n``, ``attrs`` only with ``--log-opt labels/env``;
the copier cuts a line at 16 KiB and a piece that is not the end of a line has no ``\\n`` at the end
of its ``log``; the file is renamed to ``-json.log.1`` ... and a new one begun at ``max-size``):
the pieces are joined back in order, so a partial line is completed by the next record.

kubelet's CRI format, written by the runtime (containerd ``internal/cri/io/logger.go``
``redirectLogs``; CRI-O ``internal/oci/logs``; podman's ``k8s-file`` driver too):
``<time RFC 3339 nano> <stdout|stderr> <P|F> <text>\\n``. The runtime strips each line's ``\\n``
(and a ``\\r`` before it) and tags it ``F``; a line longer than its maximum (16 KiB) is cut into
``P`` pieces followed by an ``F`` one, and output that ends without a newline is written as ``P``.
So ``F`` restores the newline and ``P`` does not. Rotated by the kubelet (``0.log`` renamed to
``0.log.<time>``, the runtime reopens ``0.log``).

Both are read as a file by :class:`vtop.sources.logtail.LogTailer`, rotations and all; these
decoders only turn its bytes into the process's bytes.
"""

from __future__ import annotations

import calendar
import json
import re

__all__ = ["CriDecoder", "DockerJsonDecoder", "RecordDecoder", "parse_rfc3339"]

_TS_RE = re.compile(r"(\d{4})-(\d\d)-(\d\d)[T ](\d\d):(\d\d):(\d\d)(?:\.(\d{1,9}))?(Z|[+-]\d\d:?\d\d)?$")


def parse_rfc3339(s: str) -> float | None:
    """Seconds since the epoch of an RFC 3339 time with up to nanoseconds (``2026-12-04T20:29:58.452584997Z``,
    ``...+01:00``); None when it is not one. Without a zone it is taken as UTC (what docker and the
    runtimes write)."""
    m = _TS_RE.match(s.strip())
    if m is None:
        return None
    y, mo, d, h, mi, se, frac, tz = m.groups()
    try:
        t = calendar.timegm((int(y), int(mo), int(d), int(h), int(mi), int(se), 0, 0, 0))
    except (ValueError, OverflowError):
        return None
    if frac:
        t += int(frac) / 10 ** len(frac)
    if tz and tz != "Z":
        sign = -1 if tz[0] == "+" else 1
        hh, mm = int(tz[1:3]), int(tz[-2:])
        t += sign * (hh * 3600 + mm * 60)
    return float(t)


class RecordDecoder:
    """Bytes of a runtime's log file -> ``(the process's bytes, the runtime's time)`` pieces.

    Records are whole lines of the file; a record still being written (no ``\\n`` yet) waits for
    the next feed. A record that is not of the format is passed on whole, with no time (a file
    that is not what vtop took it for still shows, rather than vanishing).
    """

    name = "records"
    #: bytes at most of one record kept while waiting for its end
    MAX_RECORD = 1 << 20

    def __init__(self) -> None:
        self._buf = b""
        self.bad = 0
        """Records that were not of the format."""

    def reset(self) -> None:
        self._buf = b""

    def feed(self, data: bytes) -> list[tuple[bytes, float | None]]:
        buf = self._buf + data if self._buf else data
        lines = buf.split(b"\n")
        self._buf = lines.pop()
        if len(self._buf) > self.MAX_RECORD:
            lines.append(self._buf)
            self._buf = b""
        out: list[tuple[bytes, float | None]] = []
        for rec in lines:
            if not rec:
                continue
            got = self.decode(rec)
            if got is None:
                self.bad += 1
                out.append((rec + b"\n", None))
            else:
                out.append(got)
        return out

    def flush(self) -> list[tuple[bytes, float | None]]:
        rest, self._buf = self._buf, b""
        return self.feed(rest + b"\n") if rest else []

    def decode(self, rec: bytes) -> tuple[bytes, float | None] | None:  # pragma: no cover - abstract
        raise NotImplementedError

    def unwrap(self, rec: bytes) -> bytes:
        """One record's text (for the backward startup scan and the history's tail read); the
        record itself when it is not of the format."""
        got = self.decode(rec)
        return got[0].rstrip(b"\n") if got is not None else rec


class DockerJsonDecoder(RecordDecoder):
    """docker's ``json-file`` records (see the module doc)."""

    name = "docker json-file"

    def decode(self, rec: bytes) -> tuple[bytes, float | None] | None:
        try:
            obj = json.loads(rec)
        except ValueError:
            return None
        if not isinstance(obj, dict):
            return None
        log = obj.get("log")
        if not isinstance(log, str):
            return None if "time" not in obj else (b"", _time(obj.get("time")))
        # the JSON string holds the bytes as text; invalid UTF-8 was written as U+FFFD by the writer
        return log.encode("utf-8", "surrogatepass"), _time(obj.get("time"))


def _time(x: object) -> float | None:
    return parse_rfc3339(x) if isinstance(x, str) else None


class CriDecoder(RecordDecoder):
    """kubelet's CRI records (see the module doc)."""

    name = "CRI"

    def decode(self, rec: bytes) -> tuple[bytes, float | None] | None:
        parts = rec.split(b" ", 3)
        if len(parts) < 3 or parts[1] not in (b"stdout", b"stderr"):
            return None
        t = parse_rfc3339(parts[0].decode("ascii", "replace"))
        if t is None:
            return None
        tags = parts[2].split(b":")
        text = parts[3] if len(parts) == 4 else b""
        if tags[0] == b"F":
            return text + b"\n", t
        if tags[0] == b"P":
            return text, t
        return None
