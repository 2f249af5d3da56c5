"""Fault matrix, bad input (issue #25 items 3, 6, 7, 10): every case ends with one clear line, never a
traceback, and nothing spins or waits forever.

Each case runs the real command line (``vtop.cli.main``) in-process where it fails before any thread
starts, and as a subprocess where the terminal matters (TERM=dumb).
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from vtop.cli import main
from vtop.config import ConfigError, build, parse_duration
from vtop.sources.recording.record import Recorder
from vtop.sources.urls import normalize_url, url_hostport

ENV = {"PATH": os.environ.get("PATH", ""), "HOME": "/nonexistent", "XDG_CONFIG_HOME": "/nonexistent"}


def _fails(argv: list[str], capsys: pytest.CaptureFixture[str], env: dict[str, str] | None = None) -> str:
    """Run vtop's main with ``argv``; it must exit 3 (unknown: bad usage, as monitoring plugins do) with one
    ``error:`` line and no traceback."""
    old = dict(os.environ)
    try:
        if env is not None:
            os.environ.clear()
            os.environ.update(env)
        with pytest.raises(SystemExit) as ex:
            main(argv)
    finally:
        os.environ.clear()
        os.environ.update(old)
    err = capsys.readouterr().err
    assert ex.value.code == 3, err
    assert "Traceback" not in err
    # one error line (argparse puts its usage lines before it, as every argparse tool does)
    lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith((" ", "usage:"))]
    assert len(lines) == 1 and "error:" in lines[0], err
    return lines[0]


@pytest.mark.parametrize("text", ["interval = nan", "interval = inf", "history = -inf", "stall_threshold = nan",
                                  "runaway_threshold = -5"])
def test_non_finite_or_negative_durations_in_toml_are_refused(tmp_path: Path, text: str,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "config.toml"
    cfg.write_text(text + "\n")
    line = _fails(["--config", str(cfg), "--once"], capsys)
    assert text.split()[0] in line and "finite" in line


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -1.0])
def test_parse_duration_refuses_numbers_that_are_not_durations(value: float) -> None:
    with pytest.raises(ConfigError, match="finite"):
        parse_duration(value, "interval")


def test_env_and_flag_nan_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert "interval" in _fails(["--once"], capsys, env={**ENV, "VTOP_INTERVAL": "nan"})
    assert "interval" in _fails(["--interval", "inf", "--once"], capsys, env=ENV)


def test_a_config_file_that_is_not_utf8_gets_a_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "config.toml"
    cfg.write_bytes(b'interval = 2\ntheme = "\xff\xfe"\n')
    line = _fails(["--config", str(cfg), "--once"], capsys)
    assert "not UTF-8" in line and str(cfg) in line


@pytest.mark.parametrize("url, why", [("http://[::1", "not a URL"), ("ftp://host:21", "http:// or https://"),
                                      ("http://:8000", "no host"), ("http://localhost:99999", "not a URL")])
def test_a_url_vtop_cannot_poll_gets_a_line(url: str, why: str, capsys: pytest.CaptureFixture[str]) -> None:
    line = _fails([url, "--no-gpu", "--once"], capsys, env=ENV)
    assert why in line and url in line
    # the screen path refuses it the same way, before any thread or terminal
    line = _fails([url, "--no-gpu"], capsys, env=ENV)
    assert why in line


def test_unknown_theme_gets_a_line_with_the_known_ones(capsys: pytest.CaptureFixture[str]) -> None:
    line = _fails(["--theme", "nope", "--no-gpu"], capsys, env=ENV)
    assert "'nope'" in line and "ansi-dark" in line
    line = _fails(["demo", "--theme", "nope"], capsys, env=ENV)
    assert "'nope'" in line


def test_no_gpu_and_simulated_gpus_together_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    line = _fails(["--no-gpu", "--simulate-gpus", "2", "--once"], capsys, env=ENV)
    assert "no_gpu" in line and "simulate_gpus" in line
    with pytest.raises(ConfigError):
        build({}, env={"VTOP_NO_GPU": "1", "VTOP_SIMULATE_GPUS": "4", "HOME": "/nonexistent"})


@pytest.mark.parametrize("given", ["8201", ":8201", " 8201 "])
def test_a_bare_port_is_that_port_on_localhost(given: str) -> None:
    url = normalize_url(given)
    assert url == "http://localhost:8201"
    assert url_hostport(url) == ("localhost", 8201)
    build({"urls": [given]}, env={"HOME": "/nonexistent"})  # accepted, not "host 8201"


def test_term_dumb_prints_the_one_shot_report_instead_of_the_screen() -> None:
    env = {**ENV, "TERM": "dumb", "PYTHONPATH": os.pathsep.join(sys.path)}
    r = subprocess.run([sys.executable, "-m", "vtop", "http://127.0.0.1:9", "--no-gpu", "--window", "0.5"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert "Traceback" not in r.stderr
    assert "TERM=dumb" in r.stderr and "--once" in r.stderr
    assert "\x1b[" not in r.stdout, "escape sequences on a dumb terminal"
    assert "127.0.0.1:9" in r.stdout  # the report names the server it looked at
    assert r.returncode != 0  # that server refuses: down


@pytest.mark.parametrize("name", ["rec.jsonl", "rec.jsonl.gz"])
def test_a_recording_is_0600_whatever_the_umask(tmp_path: Path, name: str) -> None:
    old = os.umask(0o022)
    try:
        path = tmp_path / name
        r = Recorder(path)
        r.close()
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    # an existing, world-readable file is narrowed before vtop appends to it
    path.chmod(0o644)
    Recorder(path).close()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
