"""Properties of the line splitter (and the tracker) under random bytes and random read splits."""

from __future__ import annotations

import re
from itertools import pairwise
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vtop.core.phases import PhaseTracker, strip_ansi
from vtop.sources.logtail import LineSplitter

LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "logs"
REAL = {
    "h200": (LOGS / "vllm-0.26.0-h200-startup.log").read_bytes(),
    "failure": (LOGS / "vllm-0.26.0-h200-failure.log").read_bytes(),
    "cpu": (LOGS / "vllm-0.32.0-cpu-startup.log").read_bytes(),
    "ansi": (LOGS / "written" / "vllm-0.11.0-ansi-1gpu.log").read_bytes(),
}
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
_WS = re.compile(r"\s+")


def chunked(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in pairwise(points)]


def run(chunks: list[bytes]) -> list[str]:
    sp = LineSplitter()
    out: list[str] = []
    for c in chunks:
        out.extend(sp.feed(c))
    out.extend(sp.flush())
    return out


def content(text: str) -> str:
    """What must survive: the text without ANSI codes and whitespace (line ends included)."""
    return _WS.sub("", strip_ansi(text))


@SETTINGS
@given(st.binary(max_size=3000), st.lists(st.integers(min_value=0, max_value=3000), max_size=20))
def test_random_bytes_never_raise_and_lose_nothing(data: bytes, cuts: list[int]) -> None:
    lines = run(chunked(data, cuts))
    for line in lines:
        assert isinstance(line, str) and "\n" not in line and "\r" not in line
    # Split only at line ends (never inside a UTF-8 sequence), so decoding per line equals decoding whole.
    assert "".join(content(x) for x in lines) == content(data.decode("utf-8", "replace"))


@SETTINGS
@given(st.sampled_from(sorted(REAL)), st.lists(st.integers(min_value=0, max_value=200_000), max_size=60))
def test_random_splits_of_real_logs_give_the_same_lines(name: str, cuts: list[int]) -> None:
    data = REAL[name]
    whole = run([data])
    split = run(chunked(data, cuts))
    # A live progress frame may come out before the spaces that pad it: compare without trailing blanks.
    assert [x.rstrip() for x in split if x.strip()] == [x.rstrip() for x in whole if x.strip()]


_record_text = st.one_of(
    st.text(
        alphabet=st.characters(blacklist_categories=("Cs", "Cc"))
        | st.sampled_from(["█", "▄", "[", "]", "%", "|", "/"]),
        min_size=1,
        max_size=60,
    ).filter(lambda s: s.strip() != ""),
    # A record quoting a bar: must not be mistaken for a live frame when a read ends after its "]".
    st.sampled_from(
        ["progress was 50%| 1/2 [00:01<00:01, 1.0it/s] then", "bar 99%|#########9| 99/100 [00:10<00:00, 9.9it/s]"]
    ),
)


@st.composite
def interleaved(draw: st.DrawFn) -> tuple[bytes, list[str], list[str]]:
    """A stream of records and tqdm bars; bars may be glued to the record that follows them."""
    parts: list[str] = []
    records: list[str] = []
    last_frames: list[str] = []
    for i in range(draw(st.integers(min_value=1, max_value=12))):
        if draw(st.booleans()):
            total = draw(st.integers(min_value=1, max_value=60))
            steps = sorted(set(draw(st.lists(st.integers(min_value=0, max_value=total), max_size=8))) | {total})
            frames = [
                f"Bar {i}: {int(100 * n / total):3d}%|{'#' * (10 * n // total):10s}| {n}/{total} [00:0{n % 10}<00:00, 9.{n}it/s]"
                for n in steps
            ]
            tag = draw(st.sampled_from(["", "(EngineCore pid=7) ", "\x1b[1;36m(Worker_TP0 pid=8)\x1b[0;0m "]))
            glue = draw(st.booleans())
            rec = f"(EngineCore pid=7) INFO 11-30 09:55:{i:02d} [m.py:{i}] " + draw(_record_text).replace(
                "\r", ""
            ).replace("\n", "")
            if glue:
                parts.append(tag + "".join("\r" + f for f in frames) + rec + draw(st.sampled_from(["\n", "\r\n"])))
                records.append(rec)
            else:
                parts.append(tag + "".join("\r" + f for f in frames) + "\n")
            last_frames.append(frames[-1])
        else:
            rec = f"INFO 11-30 09:55:{i:02d} [m.py:{i}] " + draw(_record_text).replace("\r", "").replace("\n", "")
            parts.append(rec + draw(st.sampled_from(["\n", "\r\n"])))
            records.append(rec)
    return "".join(parts).encode("utf-8"), records, last_frames


@SETTINGS
@given(interleaved(), st.lists(st.integers(min_value=0, max_value=5000), max_size=30))
def test_interleaved_frames_keep_every_record_and_each_bar_last_frame(
    case: tuple[bytes, list[str], list[str]], cuts: list[int]
) -> None:
    data, records, last_frames = case
    lines = [x.rstrip() for x in run(chunked(data, cuts))]
    for rec in records:
        assert strip_ansi(rec).rstrip() in lines
    for frame in last_frames:
        assert frame.rstrip() in lines
    assert "".join(content(x) for x in lines) == content(data.decode())


@SETTINGS
@given(st.lists(st.text(max_size=200), max_size=40), st.floats(min_value=0, max_value=1e6))
def test_tracker_never_raises_on_junk(lines: list[str], now: float) -> None:
    tr = PhaseTracker(year=2026)
    for i, line in enumerate(lines):
        tr.feed(line, float(i))
    tr.snapshot()
    tr.stalled(now)
    tr.recent(min_level="WARNING")
