"""The collector settings vtop takes once start-up is over (vtop.gc_tuning).

``settle_gc`` changes process-wide state, so it runs in a child Python here;
the app's trigger is checked with Pilot (headless apps never settle: a test
process's objects are not vtop's to freeze).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import make_app
from vtop.gc_tuning import YOUNG_THRESHOLD
from vtop.ui.app import VtopApp

CHILD = """
import gc, json, sys
from vtop.gc_tuning import hold_until_settled, settle_gc
if sys.argv[1] in ("off", "held-off"):
    gc.disable(); gc.set_threshold(0)
if sys.argv[1].startswith("held"):
    hold_until_settled()
held = not gc.isenabled()
freed = []
class Cycle:
    def __init__(self): self.me = self
    def __del__(self): freed.append(1)
kept = [Cycle() for _ in range(1000)]
for _ in range(5000): Cycle()         # start-up garbage: cycles only the collector frees
freed_before = len(freed)
before = gc.get_freeze_count()
settle_gc()
print(json.dumps({"before": before, "frozen": gc.get_freeze_count(), "threshold": gc.get_threshold(),
                  "freed": len(freed), "freed_before": freed_before, "held": held, "enabled": gc.isenabled(),
                  "tracked_after": len(gc.get_objects())}))
"""


def run_child(mode: str) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, mode], capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def test_settle_freezes_what_start_up_built_and_raises_the_young_threshold() -> None:
    r = run_child("on")
    assert r["before"] == 0 and not r["held"] and r["enabled"]
    assert 0 < r["freed_before"] < 5000  # the collector ran during start-up (700 allocations apart)
    assert r["freed"] == 5000  # start-up's garbage is collected first, not frozen
    assert r["frozen"] > 1000  # the kept cycles and everything imported
    assert r["tracked_after"] < r["frozen"] / 5  # later collections walk only what comes after
    assert r["threshold"][0] == YOUNG_THRESHOLD > 700


def test_settle_leaves_a_collector_someone_switched_off_as_it_was() -> None:
    assert run_child("off")["threshold"][0] == 0
    r = run_child("held-off")  # held after someone switched it off: still off after settling
    assert not r["enabled"] and r["threshold"][0] == 0


def test_held_start_up_collects_nothing_until_settled_then_everything() -> None:
    r = run_child("held")
    assert r["held"] and r["freed_before"] == 0  # no collection while start-up runs
    assert r["freed"] == 5000 and r["enabled"]  # one collection at settle, then the collector is back on
    assert r["frozen"] > 1000 and r["threshold"][0] == YOUNG_THRESHOLD


def test_the_dashboard_holds_the_collector_before_importing_textual() -> None:
    child = """
import gc, json, sys
import vtop.gc_tuning as g
seen = {}
orig = g.hold_until_settled
def hold():
    seen["textual_before"] = "textual" in sys.modules
    orig()
g.hold_until_settled = hold
import vtop.cli
try:
    vtop.cli.main(["--no-gpu", "--record", "/nonexistent-dir/x/rec.jsonl", "http://127.0.0.1:9"])
except SystemExit:
    pass  # the recording cannot be opened: vtop says so once the app's module is imported
print(json.dumps({"before": seen.get("textual_before"), "after": "textual" in sys.modules, "enabled": gc.isenabled()}))
"""
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, check=True)
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r == {"before": False, "after": True, "enabled": False}, out.stderr


async def test_the_app_settles_once_after_its_third_paint_tick_and_never_headless(monkeypatch) -> None:
    import vtop.gc_tuning

    calls: list[int] = []
    monkeypatch.setattr(vtop.gc_tuning, "settle_gc", lambda: calls.append(app._ticks))
    app = make_app(None)
    async with app.run_test(size=(80, 24)):
        for _ in range(5):
            app._tick()
        assert calls == []  # under Pilot the app is headless
        monkeypatch.setattr(VtopApp, "is_headless", property(lambda self: False))
        app._ticks = 0
        for _ in range(5):
            app._tick()
        assert calls == [VtopApp.SETTLE_GC_AFTER_TICKS]


@pytest.mark.parametrize("window, collector_on", [(None, False), ("0.2s", True)])
def test_a_one_shot_runs_its_round_without_the_collector_and_freezes_before_exit(
        window: str | None, collector_on: bool) -> None:
    # One round (a second or so) has no use for collections: the collector is off from before the headless
    # imports; a window (it may be minutes) keeps it on. Either way the report is out and everything is
    # frozen before the interpreter's shutdown, whose final collections would walk it all.
    child = f"""
import contextlib, gc, io, sys
from vtop.cli import main
sys.argv = ["vtop", "--once", "--json", "--no-gpu", "http://127.0.0.1:9"] + ({["--window", window]!r} if {window!r} else [])
with contextlib.redirect_stdout(io.StringIO()):
    rc = main()  # as the program runs it
print(rc, gc.isenabled(), gc.get_freeze_count() > 1000)
with contextlib.redirect_stdout(io.StringIO()):
    gc.unfreeze(); gc.enable()
    main(sys.argv[1:])  # called with its arguments (a test, a caller): the process's collector is left alone
print(gc.isenabled(), gc.get_freeze_count())
"""
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=120)
    rc, enabled, frozen, after_enabled, after_frozen = out.stdout.split()
    assert (rc, enabled, frozen) == ("2", str(collector_on), "True"), out.stderr[-2000:]
    assert (after_enabled, after_frozen) == ("True", "0"), out.stderr[-2000:]
