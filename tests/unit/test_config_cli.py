from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from vtop.cli import main, parser
from vtop.config import ConfigError, build, parse_duration


def test_defaults(tmp_path: Path) -> None:
    cfg = build({}, env={"XDG_CONFIG_HOME": str(tmp_path)})
    assert cfg.interval == 1.0 and cfg.history == 300.0 and cfg.urls == () and not cfg.no_gpu


def test_layers_flags_win_over_env_over_file(tmp_path: Path) -> None:
    d = tmp_path / "vtop"
    d.mkdir()
    (d / "config.toml").write_text('interval = 2\nhistory = "10m"\nurls = ["http://a:8000"]\nno_gpu = true\n')
    env = {"XDG_CONFIG_HOME": str(tmp_path), "VTOP_INTERVAL": "3s", "VTOP_URLS": "http://b:1,http://c:2"}
    cfg = build({}, env=env)
    assert cfg.interval == 3.0 and cfg.history == 600.0 and cfg.no_gpu
    assert cfg.urls == ("http://b:1", "http://c:2")
    assert cfg.config_path == str(d / "config.toml")
    ns = vars(parser().parse_args(["--interval", "500ms", "http://d:9"]))
    ns.pop("config_file")
    cfg = build(ns, env=env)
    assert cfg.interval == 0.5 and cfg.urls == ("http://d:9",) and cfg.history == 600.0


@pytest.mark.parametrize(
    "flags, words",
    [
        ({"interval": 0.1}, "at least 0.25"),
        ({"history": 2.0}, "at least 10 intervals"),
        ({"simulate_gpus": "many"}, "whole number"),
    ],
)
def test_bad_values_are_named(tmp_path: Path, flags: dict[str, object], words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        build(flags, env={"XDG_CONFIG_HOME": str(tmp_path)})


def test_bad_config_file_is_named(tmp_path: Path) -> None:
    f = tmp_path / "c.toml"
    f.write_text("interval = [")
    with pytest.raises(ConfigError, match="not valid TOML"):
        build({}, env={}, config_file=str(f))
    f.write_text("intervall = 2")
    with pytest.raises(ConfigError, match="unknown setting"):
        build({}, env={}, config_file=str(f))


def test_durations() -> None:
    assert parse_duration("5m", "x") == 300 and parse_duration("250ms", "x") == 0.25
    assert parse_duration("1h", "x") == 3600 and parse_duration(7, "x") == 7
    with pytest.raises(ConfigError):
        parse_duration("soon", "x")


def test_cli_errors_are_one_line_not_a_traceback(tmp_path: Path) -> None:
    env = {"XDG_CONFIG_HOME": str(tmp_path), "PATH": "/usr/bin:/bin", "VTOP_INTERVAL": "0.01"}
    r = subprocess.run([sys.executable, "-m", "vtop"], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 3  # unknown: the monitoring-plugin convention keeps 2 for critical
    assert r.stderr.strip() == "vtop: error: interval: at least 0.25 s, got 0.01"
    r = subprocess.run([sys.executable, "-m", "vtop", "--interval", "fast"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 3 and "Traceback" not in r.stderr and "interval" in r.stderr


def test_version_and_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.startswith("vtop 0.")
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    for flag in ("--interval", "--history", "--no-gpu", "--version", "URL"):
        assert flag in out


@pytest.mark.parametrize("env, want", [(None, "120 0.00833"), ("30", "30 0.03333")])
def test_the_dashboard_lets_textual_draw_up_to_120_frames_a_second_unless_told(env, want) -> None:  # type: ignore[no-untyped-def]
    """A key's relayout waits for Textual's update timer, at most two of its periods
    after a frame: 33 ms at Textual's default 60 a second, 17 ms at 120. The user's
    TEXTUAL_FPS stands. Checked on Textual's own constants in a fresh process, after
    vtop's main() has started (and stopped at --version)."""
    import os
    import subprocess
    import sys

    code = ("import vtop.cli as c\n"
            "try:\n    c.main(['--version'])\nexcept SystemExit:\n    pass\n"
            "import textual.constants as k, textual.screen as s\n"
            "print(k.MAX_FPS, f'{s.UPDATE_PERIOD:.5f}')")
    e = {k: v for k, v in os.environ.items() if k != "TEXTUAL_FPS"}
    if env is not None:
        e["TEXTUAL_FPS"] = env
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=e)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == want
