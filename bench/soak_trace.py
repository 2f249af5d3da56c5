"""vtop under tracemalloc, for finding what grows (bench/soak.py --trace DIR runs this).

    python bench/soak_trace.py DIR [vtop args...]

Starts ``tracemalloc`` (``VTOP_SOAK_TRACE_FRAMES`` frames, default 1; 0: off,
object counts only: tracemalloc with deep stacks slows vtop several times over
on a small box) and vtop's own ``main`` in this process. A daemon thread looks
every ``VTOP_SOAK_TRACE_S`` seconds (default 60); from the second look on it
writes ``DIR/trace-<minute>.txt``: the 25 call sites whose memory grew most
since the first look (with the stacks of the top ones when more than one frame
is kept), the traced total, and the 25 object types whose count grew most
(``gc.get_objects``: what the collector tracks, start-up's frozen objects not). vtop itself knows nothing
of this: nothing under ``vtop/`` reads the variable or the folder.
"""

from __future__ import annotations

import gc
import os
import sys
import threading
import time
import tracemalloc
from collections import Counter
from pathlib import Path


def _type_counts() -> Counter[str]:
    # Objects made since start-up (vtop freezes those: gc.get_objects does not list them,
    # and unfreezing here would change what vtop's collector does).
    return Counter(type(o).__qualname__ for o in gc.get_objects())


def _snap() -> tracemalloc.Snapshot | None:
    if not tracemalloc.is_tracing():
        return None
    return tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(False, tracemalloc.__file__)])


def _watch(out: Path, every: float, frames: int) -> None:
    t0 = time.monotonic()
    time.sleep(every)
    base = prev = _snap()
    base_types = _type_counts()
    while True:
        time.sleep(every)
        snap = _snap()
        minute = (time.monotonic() - t0) / 60
        lines = [f"# {minute:.1f} min"]
        if snap is not None and base is not None:
            cur, peak = tracemalloc.get_traced_memory()
            lines[0] += f"; traced now {cur / 1e6:.1f} MB, peak {peak / 1e6:.1f} MB"
            lines.append("## growth by line since the first look")
            for st in snap.compare_to(base, "lineno")[:25]:
                lines.append(f"{st.size_diff / 1e3:+9.1f} kB {st.count_diff:+7d} objs  {st.traceback[0]}")
            if prev is not None:
                lines.append("## growth by line since the look before")
                for st in snap.compare_to(prev, "lineno")[:25]:
                    lines.append(f"{st.size_diff / 1e3:+9.1f} kB {st.count_diff:+7d} objs  {st.traceback[0]}")
            if frames > 1:
                lines.append("## growth by stack (top 6)")
                for st in snap.compare_to(base, "traceback")[:6]:
                    lines.append(f"{st.size_diff / 1e3:+9.1f} kB {st.count_diff:+7d} objs")
                    lines += ["      " + ln for ln in st.traceback.format()[-24:]]
        prev = snap
        types = _type_counts()
        lines.append("## object counts that grew (type, now, change since the first look)")
        for name, d in sorted(((k, types[k] - base_types.get(k, 0)) for k in types), key=lambda kv: -kv[1])[:25]:
            lines.append(f"{name:40s} {types[name]:8d} {d:+8d}")
        (out / f"trace-{minute:05.1f}.txt").write_text("\n".join(lines) + "\n")


def main() -> int:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    frames = int(os.environ.get("VTOP_SOAK_TRACE_FRAMES", "1"))
    if frames > 0:
        tracemalloc.start(frames)
    every = float(os.environ.get("VTOP_SOAK_TRACE_S", "60"))
    threading.Thread(target=_watch, args=(out, every, frames), daemon=True, name="soak-trace").start()
    from vtop.cli import main as vtop_main

    return vtop_main(sys.argv[2:])


if __name__ == "__main__":
    raise SystemExit(main())
