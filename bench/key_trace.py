"""Where a key press's time goes: in vtop, or in the terminal.

    .venv/bin/python bench/key_trace.py                 # scenario (c), one server hung, 60 presses of 'l'
    .venv/bin/python bench/key_trace.py --no-hang -n 40

``bench/run.py`` times a key from ``tmux send-keys`` to the first
``capture-pane`` that shows its effect. This runs the same presses against a
vtop that notes, on the same clock (CLOCK_MONOTONIC, shared by processes),
when the action ran, when the frame after it was written, and what else
held the event loop meanwhile (asyncio callbacks over 2 ms, collections of
the garbage collector). Each press then splits into three parts:

* send -> action: tmux, the terminal, Textual's input thread, and whatever
  the event loop was busy with when the key arrived;
* action -> frame written: the relayout and repaint the key causes;
* frame -> seen: the output thread, tmux, and the bench's polling (every
  10 ms, ~3 ms a capture).

It prints each part's median, p95 and max, and the slowest presses with
what ran during them. The instrumentation wraps a few of Textual's and vtop's
methods (the app runs ~5 % slower); it is a diagnosis, not a figure.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from harness import ServerProcess, Tmux, key_latencies  # noqa: E402
from run import KEY, log_pane_shown  # noqa: E402  (the bench's own key and test of the screen)


def _app_main(trace: str) -> None:
    """Run vtop with its key action, frames, slow callbacks and collections noted in ``trace``."""
    import asyncio.events
    import gc

    events: list[tuple[str, float, float]] = []
    mono = time.monotonic

    def note(kind: str, t0: float, t1: float) -> None:
        events.append((kind, t0, t1))

    from textual.app import App

    import vtop.ui.app as va

    orig_display = App._display

    def _display(self, *a, **k):  # type: ignore[no-untyped-def]
        t = mono()
        try:
            return orig_display(self, *a, **k)
        finally:
            note("frame", t, mono())

    App._display = _display  # type: ignore[method-assign]
    orig_toggle = va.VtopApp.action_toggle_log

    def toggle(self):  # type: ignore[no-untyped-def]
        t = mono()
        try:
            return orig_toggle(self)
        finally:
            note("action", t, mono())

    va.VtopApp.action_toggle_log = toggle  # type: ignore[method-assign]
    orig_run = asyncio.events.Handle._run

    def _run(self):  # type: ignore[no-untyped-def]
        t = mono()
        try:
            return orig_run(self)
        finally:
            d = mono() - t
            if d > 0.002:
                cb = getattr(self, "_callback", None)
                what = repr(cb)[:80]
                try:
                    what = "task " + cb.__self__.get_coro().__qualname__  # type: ignore[union-attr]
                except AttributeError:
                    pass
                note("cb " + what, t, t + d)

    asyncio.events.Handle._run = _run  # type: ignore[method-assign]
    gc_start = [0.0]

    def on_gc(phase: str, info: dict) -> None:  # type: ignore[type-arg]
        if phase == "start":
            gc_start[0] = mono()
        else:
            note(f"gc gen{info['generation']}", gc_start[0], mono())

    gc.callbacks.append(on_gc)
    from vtop.cli import main

    try:
        main(sys.argv[1:])
    finally:
        Path(trace).write_text(json.dumps(events))


def _stats(xs: list[float]) -> str:
    xs = sorted(xs)
    if not xs:
        return "-"
    p95 = xs[min(len(xs) - 1, round(0.95 * (len(xs) - 1)))]
    return f"median {statistics.median(xs):5.1f}  p95 {p95:5.1f}  max {xs[-1]:5.1f} ms"


def split(presses: list[tuple[float, float | None]], events: list[list]) -> list[dict]:  # type: ignore[type-arg]
    """Each press split at its action and at the end of the first frame written after it."""
    actions = [e for e in events if e[0] == "action"]
    frames = [e for e in events if e[0] == "frame"]
    rows = []
    for t_send, took in presses:
        if took is None:
            continue
        seen = t_send + took
        act = next((e for e in actions if e[1] >= t_send), None)
        if act is None or act[1] > seen:
            continue
        frame = next((f for f in frames if f[2] >= act[2]), None)
        if frame is None:
            continue
        rows.append({
            "seen_ms": took * 1000,
            "send_to_action_ms": (act[1] - t_send) * 1000,
            "action_to_frame_ms": (frame[2] - act[1]) * 1000,
            "frame_to_seen_ms": (seen - frame[2]) * 1000,
            "during": [(e[0], round((e[1] - t_send) * 1000, 1), round((e[2] - e[1]) * 1000, 1))
                       for e in events if e[2] >= t_send and e[1] <= seen],
        })
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=60, help="presses of 'l'")
    ap.add_argument("--no-hang", action="store_true", help="leave both servers answering")
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--out", help="write the split presses as JSON here")
    a = ap.parse_args()
    fd, trace = tempfile.mkstemp(prefix="vtop-key-trace-", suffix=".json")
    os.close(fd)
    os.unlink(trace)
    tmux = Tmux()
    try:
        with ServerProcess(2) as sp:
            argv = [sys.executable, __file__, "--app", trace, "--simulate-gpus", str(a.gpus), "--interval", "1", *sp.urls]
            tmux.new("kt", argv)
            time.sleep(10)
            if not a.no_hang:
                sp.control(0, "hang")
                tmux.wait_for("kt", lambda s: "STALE" in s, timeout=20)
            sent: list[float] = []
            took = key_latencies(tmux, "kt", KEY, log_pane_shown, a.n, seed=3, sent=sent)
            presses = list(zip(sent, took))
            tmux.send_keys("kt", "q")
            for _ in range(200):
                if Path(trace).exists() and Path(trace).stat().st_size:
                    break
                time.sleep(0.05)
    finally:
        tmux.close()
    events = json.loads(Path(trace).read_text())
    os.unlink(trace)
    rows = split(presses, events)
    print(f"{len(rows)} of {len(presses)} presses of 'l' traced; {a.gpus} GPUs + 2 servers"
          f"{'' if a.no_hang else ', server 1 hung'}")
    for key, label in (("seen_ms", "seen (send-keys -> capture)"), ("send_to_action_ms", "send -> action"),
                       ("action_to_frame_ms", "action -> frame written"), ("frame_to_seen_ms", "frame -> seen")):
        print(f"  {label:<28} {_stats([r[key] for r in rows])}")
    print("slowest presses (ms: seen = in + action..frame + out; then what held the loop, from the send):")
    for r in sorted(rows, key=lambda r: -r["seen_ms"])[:5]:
        print(f"  {r['seen_ms']:5.1f} = {r['send_to_action_ms']:4.1f} + {r['action_to_frame_ms']:4.1f} + "
              f"{r['frame_to_seen_ms']:4.1f}  " + ", ".join(f"{k} @{t:.0f} {d:.1f}" for k, t, d in r["during"]
                                                         if k not in ("action",)))
    if a.out:
        Path(a.out).write_text(json.dumps(rows))
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--app":
        trace_path = sys.argv[2]
        del sys.argv[1:3]
        _app_main(trace_path)
    else:
        sys.exit(main())
