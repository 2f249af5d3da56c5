"""Text of a log line as it comes off the wire: ANSI codes, tqdm frames, lines glued by ``\\r``,
the banner's version. Pure; shared by the log tail (sources) and the phase tracker (core)."""

from __future__ import annotations

import re

_ANSI_RE = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b[@-Z\\-_]|\^\[\[[0-9;]*[A-Za-z]")


def strip_ansi(text: str) -> str:
    """Remove ANSI escape codes: vLLM ≤0.15 colours its process tag even in files."""
    if "\x1b" not in text and "^[" not in text:
        return text
    return _ANSI_RE.sub("", text)


# "7/51 [00:00<00:00, 68.16it/s]" at the end of a tqdm frame. Every tqdm stats
# bracket (vLLM's shard bar format included) holds "elapsed<remaining", so a
# line without "<" is never a frame: a cheap check before the regexes.
_TQDM_BRACKET_RE = re.compile(r"\d+/\d+ \[[^\[\]\r\n<]*<[^\[\]\r\n]*\]")
_TQDM_TAIL_RE = re.compile(r"\d+/\d+ \[[^\[\]\r\n<]*<[^\[\]\r\n]*\]\s*$")
# Start of a log record, possibly glued to a tqdm frame (vllm issue #25848).
_RECORD_START_RE = re.compile(
    r"(?:\([^()\r\n]+? pid=\d+\) )?(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d"
)


def is_progress_frame(text: str) -> bool:
    """True for a complete tqdm frame such as ``Capturing ...: 14%|█▎ | 7/51 [00:00<00:00, 68.16it/s]``.

    A log record that merely contains such text is not a frame (frames never start with a header).
    """
    return (
        "%" in text and "<" in text and _TQDM_TAIL_RE.search(text) is not None and _RECORD_START_RE.match(text) is None
    )


def split_glued(text: str) -> list[str]:
    """Split a tqdm frame from the log record glued right after it.

    tqdm on stderr and logging on stdout share the terminal or file, so the last
    frame of a bar can be followed, on the same physical line, by the next record:
    ``...| 65/67 [00:15<00:00,  4.58it/s](Worker_TP2 pid=27) INFO 09-29 ...``.
    Only a record start that follows a tqdm ``n/total [...]`` tail is split off,
    so a message that merely quotes a log line is left alone.
    """
    if "<" not in text or _TQDM_BRACKET_RE.search(text) is None:
        return [text]
    out: list[str] = []
    start = 0
    for m in _RECORD_START_RE.finditer(text):
        pos = m.start()
        if pos <= start:
            continue
        head = text[start:pos]
        if _TQDM_TAIL_RE.search(head):
            out.append(head)
            start = pos
    out.append(text[start:])
    return out


# --------------------------------------------------------------------------- line parser

BANNER_RES = (
    re.compile(r"vLLM API server version (?P<ver>\S+)"),
    re.compile(r"vLLM server version (?P<ver>[^\s,]+), serving model (?P<model>\S+)"),
    re.compile(r"[█▀▄]\s+version\s+(?P<ver>\d+\.\d+[\w.+-]*)"),
)
LOGO_MODEL_RE = re.compile(r"[█▀▄]\s+model\s+(?P<model>\S+)")


def banner_version(line: str) -> str | None:
    """The vLLM version if ``line`` is a startup banner (any version's form), else ``None``."""
    text = strip_ansi(line)
    for rx in BANNER_RES:
        m = rx.search(text)
        if m:
            return m.group("ver").rstrip(",")
    return None


