"""Keep a trace small: drop the ``/metrics`` samples vtop does not read.

    python -m tools.corpus.shrink TRACE_DIR [...]

Rewrites ``metrics.jsonl.gz`` keeping, in each body, the samples whose names vtop's
parser reads (:data:`vtop.sources.metrics_text.WANTED_SAMPLE_NAMES`) with their ``# HELP`` and
``# TYPE`` lines, and records the dropped family names once (``"dropped"`` in the first
row). Every other file is left as recorded. Safe to run twice.
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path


def keep_line(line: str, wanted: frozenset[str], families: frozenset[str]) -> bool:
    if line.startswith("#"):
        parts = line.split(None, 3)
        return len(parts) >= 3 and parts[2] in families
    name = line.split("{", 1)[0].split(" ", 1)[0]
    return name in wanted


def shrink(trace: Path) -> tuple[int, int]:
    from vtop.sources.metrics_text import HISTOGRAM_FAMILIES, WANTED_SAMPLE_NAMES

    wanted = frozenset(WANTED_SAMPLE_NAMES)
    families = frozenset(WANTED_SAMPLE_NAMES) | frozenset(HISTOGRAM_FAMILIES)
    path = trace / "metrics.jsonl.gz"
    before = path.stat().st_size
    rows = []
    dropped: set[str] = set()
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            row = json.loads(line)
            text = row.get("text")
            if isinstance(text, str):
                kept = []
                for ln in text.splitlines():
                    if keep_line(ln, wanted, families):
                        kept.append(ln)
                    elif not ln.startswith("#") and ln.strip():
                        dropped.add(ln.split("{", 1)[0].split(" ", 1)[0])
                row["text"] = "\n".join(kept) + "\n"
            rows.append(row)
    if rows:
        rows[0]["dropped"] = sorted(set(rows[0].get("dropped") or ()) | dropped)
    tmp = path.with_suffix(".tmp")
    with gzip.open(tmp, "wt", encoding="utf-8", compresslevel=9) as f:
        for row in rows:
            f.write(json.dumps(row, separators=(",", ":")) + "\n")
    tmp.replace(path)
    return before, path.stat().st_size


def main(argv: list[str]) -> int:
    for arg in argv:
        before, after = shrink(Path(arg))
        print(f"{arg}: metrics {before / 1024:.0f} KB -> {after / 1024:.0f} KB")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
