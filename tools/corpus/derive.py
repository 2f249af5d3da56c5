"""Corpus traces derived from real recorded ones, for what a recording box cannot show by itself.

    python -m tools.corpus.derive shift SRC DST HOURS
    python -m tools.corpus.derive old-log SRC LOG_SRC DST HOURS [--cut-at EVENT]

* ``shift``: the vLLM log's time stamps (``LEVEL MM-DD HH:MM:SS``) moved by ``HOURS`` (+8, -8):
  the log of a server whose clock (its container's time zone) is not the one vtop runs in, e.g. a
  container in UTC beside a host in UTC+8. Every other file is copied byte for byte: the lines still
  arrive when they did (``log-index.jsonl.gz``), only what they say of their own time differs. A stamp
  keeps its width, so the log's sizes stay right.
* ``old-log``: what ``vtop --log OLD_FILE`` sees next to a server: the server's files of ``SRC``
  (``/metrics``, ``/health``, the processes) as recorded, and as ``--log`` the log of ``LOG_SRC``
  (cut after the last line written before its ``--cut-at`` event of ``events.jsonl``, e.g. ``sigstop``:
  a start that never finished) with its stamps moved so that its last line was written ``HOURS``
  before the server's recording begins, there whole at the first second and never written to again;
  its modification time (``mtime`` in ``log-index.jsonl.gz``) is when its last line was written.

The truth (``truth.json``) is copied with ``derived_from``, ``derivation`` and ``notes`` saying how; the
times of the incident are the recording's, untouched. ``tests/corpus/traces/INDEX.md`` says the same.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import shutil
import sys
import time
from pathlib import Path

STAMP_RE = re.compile(rb"\b(DEBUG|INFO|WARNING|ERROR|CRITICAL) (\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)\b")


def shift_stamps(data: bytes, hours: float, year: int) -> bytes:
    """``data`` with every vLLM stamp moved by ``hours`` (the same width: MM-DD HH:MM:SS)."""
    import calendar

    delta = int(round(hours * 3600))

    def one(m: re.Match[bytes]) -> bytes:
        mon, day, hh, mi, ss = (int(x) for x in m.groups()[1:])
        t = calendar.timegm((year, mon, day, hh, mi, ss, 0, 0, 0)) + delta
        g = time.gmtime(t)
        return m.group(1) + b" " + time.strftime("%m-%d %H:%M:%S", g).encode()

    return STAMP_RE.sub(one, data)


def _rows(path: Path) -> list[dict]:
    with gzip.open(path, "rt") as f:
        return [json.loads(ln) for ln in f if ln.strip()]


def _write_rows(path: Path, rows: list[dict]) -> None:
    text = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in rows)
    path.write_bytes(gzip.compress(text.encode(), mtime=0))


def _year_of(src: Path) -> int:
    t = json.loads((src / "truth.json").read_text()).get("began") or time.time()
    return time.gmtime(float(t)).tm_year


def shift(src: Path, dst: Path, hours: float) -> None:
    shutil.copytree(src, dst)
    data = gzip.decompress((src / "log.bin.gz").read_bytes())
    out = shift_stamps(data, hours, _year_of(src))
    assert len(out) == len(data)
    (dst / "log.bin.gz").write_bytes(gzip.compress(out, mtime=0))
    truth = json.loads((src / "truth.json").read_text())
    sign = "ahead of" if hours > 0 else "behind"
    truth["name"] = dst.name
    truth["derived_from"] = src.name
    truth["derivation"] = f"python -m tools.corpus.derive shift {src.name} {dst.name} {hours:+g}"
    truth["notes"] = (f"Derived from the real recording {src.name}: the vLLM log's time stamps moved {hours:+g} h "
                      f"(the log's clock {abs(hours):g} h {sign} vtop's, as a server in a container in another time "
                      f"zone writes it); every line arrives when it did, every other file as recorded. "
                      f"The recording: {truth.get('notes', '')}")
    (dst / "truth.json").write_text(json.dumps(truth, indent=2) + "\n")


def old_log(src: Path, log_src: Path, dst: Path, hours: float, cut_at: str | None) -> None:
    """See the module's docstring."""
    shutil.copytree(src, dst)
    data = gzip.decompress((log_src / "log.bin.gz").read_bytes())
    index = _rows(log_src / "log-index.jsonl.gz")
    last_t = index[-1]["t"]
    if cut_at:
        ev = [json.loads(ln) for ln in (log_src / "events.jsonl").read_text().splitlines() if ln.strip()]
        at = next(float(e["mono"]) for e in ev if e.get("what") == cut_at)
        before = [r for r in index if float(r["mono"]) <= at]
        size = int(before[-1]["size"])
        # the last line written before the event: whole lines only
        size = data.rfind(b"\n", 0, size) + 1
        data = data[:size]
        last_t = next(r["t"] for r in index if int(r["size"]) >= size)
    # its last line written HOURS before the first second of the server's recording
    first = _rows(src / "log-index.jsonl.gz")
    mtime = round(float(first[0]["t"]) - hours * 3600, 3)
    old = shift_stamps(data, (mtime - float(last_t)) / 3600.0, _year_of(log_src))
    (dst / "log.bin.gz").write_bytes(gzip.compress(old, mtime=0))
    # the whole file there at the first second vtop reads it, never written again
    _write_rows(dst / "log-index.jsonl.gz", [{"t": r["t"], "mono": r["mono"], "size": len(old), "mtime": mtime}
                                             for r in first])
    truth = json.loads((src / "truth.json").read_text())
    truth["name"] = dst.name
    truth["derived_from"] = [src.name, log_src.name]
    truth["derivation"] = (f"python -m tools.corpus.derive old-log {src.name} {log_src.name} {dst.name} {hours:g}"
                           + (f" --cut-at {cut_at}" if cut_at else ""))
    truth["log_age_s"] = round(hours * 3600)
    # the phase the server's start ended in is not the old log's (a start of another day)
    truth["expected_phase"] = None
    truth["notes"] = (f"Derived from two real recordings: the server ({src.name}: /metrics, /health, processes as "
                      f"recorded) with, given as --log, an old log: {log_src.name}'s log"
                      + (f" up to its last line before '{cut_at}' (a start that never finished)" if cut_at else "")
                      + f", its stamps moved so that its last line and its modification time are {hours:g} h before the "
                      f"server's recording begins, whole at the first read and never "
                      f"written again. Not a stall: an old file. The server's recording: {truth.get('notes', '')}")
    (dst / "truth.json").write_text(json.dumps(truth, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.corpus.derive", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("shift")
    s.add_argument("src", type=Path)
    s.add_argument("dst", type=Path)
    s.add_argument("hours", type=float)
    o = sub.add_parser("old-log")
    o.add_argument("src", type=Path)
    o.add_argument("log_src", type=Path)
    o.add_argument("dst", type=Path)
    o.add_argument("hours", type=float)
    o.add_argument("--cut-at")
    a = ap.parse_args(argv)
    if a.cmd == "shift":
        shift(a.src, a.dst, a.hours)
    else:
        old_log(a.src, a.log_src, a.dst, a.hours, a.cut_at)
    return 0


if __name__ == "__main__":
    sys.exit(main())
