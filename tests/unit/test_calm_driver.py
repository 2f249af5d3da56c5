"""The calm key thread (vtop/ui/driver.py): fewer wake-ups while idle, ESC and q as quick as before."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vtop.ui import driver as drv


def test_the_installed_textual_is_one_the_calm_driver_was_tested_with() -> None:
    """Fails loudly on a Textual release vtop/ui/driver.py does not know: check the key
    thread still works as the module doc says, then add the version to TESTED_TEXTUAL."""
    from importlib.metadata import version

    assert version("textual") in drv.TESTED_TEXTUAL, (
        f"Textual {version('textual')} is not in vtop.ui.driver.TESTED_TEXTUAL {drv.TESTED_TEXTUAL}: "
        "users of it get Textual's own driver; check CalmSelector against it and add it")
    assert drv.textual_is_tested()


@pytest.mark.parametrize("dist, module", [("textual", "textual"), ("rich", "rich"), ("h11", "h11"),
                                          ("psutil", "psutil"), ("nvidia-ml-py", "pynvml")])
def test_installed_version_agrees_with_importlib_metadata(dist: str, module: str) -> None:
    """The dist-info folder's name gives the version importlib.metadata gives, for a package and for a
    one-file module (pynvml.py, whose distribution has another name)."""
    import importlib
    from importlib.metadata import version

    assert drv.installed_version(dist, importlib.import_module(module).__file__ or "") == version(dist)


def test_installed_version_is_none_where_the_dist_info_is_missing_or_not_alone(tmp_path: Path) -> None:
    pkg = tmp_path / "textual"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    assert drv.installed_version("textual", str(pkg / "__init__.py")) is None  # a copied tree
    (tmp_path / "textual-8.2.8.dist-info").mkdir()
    (tmp_path / "textual_serve-1.1.3.dist-info").mkdir()  # another distribution's: not counted
    assert drv.installed_version("textual", str(pkg / "__init__.py")) == "8.2.8"
    (tmp_path / "Textual-9.0.0.dist-info").mkdir()  # two installs on top of each other
    assert drv.installed_version("textual", str(pkg / "__init__.py")) is None


def test_the_dashboard_does_not_import_importlib_metadata() -> None:
    """Reading Textual's version for the driver must not bring importlib.metadata (email, zipfile, csv:
    1.6 MB of resident memory, 18 ms of the start)."""
    code = ("import sys\nfrom vtop.ui.driver import calm_driver_class\nassert calm_driver_class() is not None\n"
            "print('importlib.metadata' in sys.modules, 'email' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd="/")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "False"]


def test_an_unknown_textual_gets_textuals_own_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(drv, "TESTED_TEXTUAL", ("0.0.1",))
    assert drv.calm_driver_class() is None


def test_selector_waits_longer_while_idle_and_as_asked_after_input(monkeypatch: pytest.MonkeyPatch) -> None:
    r, w = os.pipe()
    wake_r, wake_w = os.pipe()
    sel = drv.CalmSelector(wake_r)
    sel.register(r, drv.selectors.EVENT_READ)
    sel._last_input = time.monotonic() - 10  # nobody typed for a while
    t0 = time.monotonic()
    assert sel.select(0.1) == []
    assert sel.waits[-1] == drv.IDLE_TIMEOUT_S and time.monotonic() - t0 >= 0.9
    os.write(w, b"q")
    got = sel.select(0.1)
    assert len(got) == 1 and got[0][0].fd == r
    os.read(r, 10)
    sel.select(0.1)
    assert sel.waits[-1] == 0.1, "right after input it waits as Textual asks (ESC needs it)"
    # the wake pipe ends an idle wait (made 60 s here, so only the pipe can end it)
    # and is never handed to Textual as input
    monkeypatch.setattr(drv, "IDLE_TIMEOUT_S", 60.0)
    sel._last_input = time.monotonic() - 10
    os.write(wake_w, b"x")
    t0 = time.monotonic()
    assert sel.select(0.1) == []
    assert sel.waits[-1] == 60.0 and time.monotonic() - t0 < 30
    sel.close()
    for fd in (r, w, wake_r, wake_w):
        os.close(fd)


def test_textual_still_reads_keys_the_way_the_shim_expects() -> None:
    from textual.drivers import linux_driver

    assert drv.calm_driver_class() is not None
    src = Path(linux_driver.__file__).read_text()
    assert "selectors.SelectSelector()" in src, "Textual changed how it reads keys: revisit vtop/ui/driver.py"


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_in_a_real_terminal_with_the_calm_driver_esc_and_q_work(tmp_path: Path) -> None:
    sess = f"vtop-calm-{os.getpid()}"
    pidfile = tmp_path / "pid"
    env = {**os.environ, "XDG_CONFIG_HOME": "/nonexistent"}
    cmd = f"echo $$ > {pidfile}; exec {sys.executable} -m vtop --no-gpu http://127.0.0.1:9"
    subprocess.run(["tmux", "new", "-d", "-s", sess, "-x", "100", "-y", "30", cmd], check=True, env=env)

    def screen() -> str:
        return subprocess.run(["tmux", "capture-pane", "-p", "-t", sess], capture_output=True, text=True).stdout

    def until(cond, timeout: float) -> float:  # type: ignore[no-untyped-def]
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if cond():
                return time.monotonic() - t0
            time.sleep(0.02)
        raise AssertionError(f"not within {timeout} s:\n{screen()}")

    try:
        until(lambda: pidfile.exists() and "vLLM" in screen(), 60)
        pid = int(pidfile.read_text())

        # How often the key thread wakes while idle is a rate, and a busy box's GIL hand-offs
        # add wake-ups of their own: the selector's timeouts are checked above
        # (test_selector_waits_longer_while_idle...), the CPU it saves in bench/run.py.
        subprocess.run(["tmux", "send-keys", "-t", sess, "r"], check=True)
        until(lambda: "Requests in flight" in screen(), 30)
        subprocess.run(["tmux", "send-keys", "-t", sess, "Escape"], check=True)
        until(lambda: "Requests in flight" not in screen(), 30)
        subprocess.run(["tmux", "send-keys", "-t", sess, "q"], check=True)
        until(lambda: not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split(") ")[1][:1], 30)
    finally:
        subprocess.run(["tmux", "kill-session", "-t", sess], capture_output=True)
