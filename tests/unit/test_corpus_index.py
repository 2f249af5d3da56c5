"""The recorder's INDEX.md line: a new trace's row joins the first table, the sections after it stay whole."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from tools.corpus import record


def _trace(root: Path, name: str) -> Path:
    t = root / name
    t.mkdir()
    (t / "truth.json").write_text(json.dumps({"class": "kv_saturation", "duration_s": 12.0, "notes": "n"}))
    (t / "events.jsonl").write_text(json.dumps({"what": "ready", "healthy_after_s": 3.0}) + "\n")
    with gzip.open(t / "log.bin.gz", "wb") as f:
        f.write(b"INFO Application startup complete\n")
    return t


def test_a_new_row_joins_the_first_table_and_the_derived_section_stays(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    index = tmp_path / "INDEX.md"
    index.write_text(
        "# The traces\n\nintro\n\n| name | class | duration | what | key log lines | size |\n"
        "| --- | --- | --- | --- | --- | --- |\n| a-trace | normal | 1 s | x | y | 1 KB |\n"
        "| z-trace | normal | 1 s | x | y | 1 KB |\n\n## Derived traces\n\nMade from the real recordings.\n\n"
        "| name | class | duration | what | key log lines | size |\n| --- | --- | --- | --- | --- | --- |\n"
        "| b-derived | normal | 1 s | x | y | 1 KB |\n")
    monkeypatch.setattr(record, "INDEX", index)
    monkeypatch.setattr(record, "TRACES", tmp_path)
    record.write_index(_trace(tmp_path, "m-trace"))
    lines = index.read_text().splitlines()
    rows = [ln.split(" | ")[0][2:] for ln in lines if ln.startswith("| ") and not ln.startswith("| name")
            and not ln.startswith("| ---")]
    assert rows == ["a-trace", "m-trace", "z-trace", "b-derived"], rows
    assert lines.index("## Derived traces") > lines.index("| z-trace | normal | 1 s | x | y | 1 KB |")
    assert lines.count("| --- | --- | --- | --- | --- | --- |") == 2
    # written again: the row is replaced, not added
    record.write_index(tmp_path / "m-trace")
    assert sum(ln.startswith("| m-trace |") for ln in index.read_text().splitlines()) == 1
