"""`vtop --once`, `vtop doctor` and `vtop replay --doctor` exit as monitoring plugins do
(0 OK, 1 warning, 2 critical, 3 unknown), say the window asked for, and take every
threshold flag the screen takes (one definition)."""

from __future__ import annotations

import argparse

import pytest

from vtop import cli
from vtop.exitcodes import EXIT_CRITICAL, EXIT_OK, EXIT_UNKNOWN, EXIT_WARNING
from vtop.faces.headless import Report, format_text


def _report(alerts: list[dict[str, str]], states: tuple[str, ...] = ("up",), *, looked: bool = True,
            window: float = 5.2, asked: float | None = 5.0) -> Report:
    return Report(t=0.0, window_s=window, host="h", gpu_status="off", gpu_message=None, gpus=[],
                  servers=[{"url": "http://x", "state": s, "message": "", "model": None, "version": None,
                            "running": None} for s in states],
                  startup=None, requests=[], alerts=alerts, window_asked_s=asked, looked=looked)


def test_exit_status_follows_the_monitoring_plugin_convention() -> None:
    warn = {"severity": "warning", "rule": "runaway", "title": "t"}
    crit = {"severity": "critical", "rule": "engine_stall", "title": "t"}
    info = {"severity": "info", "rule": "risky_flags", "title": "t"}
    assert _report([]).exit_code == EXIT_OK == 0
    assert _report([info]).exit_code == EXIT_OK
    assert _report([warn]).exit_code == EXIT_WARNING == 1  # was 0: `doctor || page` missed a warning runaway
    assert _report([warn, crit]).exit_code == EXIT_CRITICAL == 2
    assert _report([], ("down",)).exit_code == EXIT_CRITICAL
    assert _report([warn], ("engine dead",)).exit_code == EXIT_CRITICAL
    assert _report([], (), looked=False).exit_code == EXIT_UNKNOWN == 3
    assert _report([warn], (), looked=False).exit_code == EXIT_WARNING  # what it did see still counts
    assert _report([warn]).to_json()["exit_code"] == 1


def test_no_source_answered_is_unknown() -> None:
    from vtop.config import Config
    from vtop.faces.headless import report
    from vtop.monitor.monitor import Monitor

    m = Monitor(Config(urls=("http://127.0.0.1:9",)))
    m.add_cli_urls()
    rep = report(m, m.clock.monotonic(), window_asked_s=1.0)
    assert not rep.looked and rep.exit_code == EXIT_UNKNOWN


def test_the_text_says_the_window_asked_for() -> None:
    assert "(5 s window)" in format_text(_report([], window=5.4, asked=5.0))  # printed "4 s window" before
    assert "(5 s window)" in format_text(_report([], window=4.6, asked=5.0))
    assert "5 s window, 9.2 s with the wait" in format_text(_report([], window=9.2, asked=5.0))
    assert "(0.5 s window)" in format_text(_report([], window=0.6, asked=0.5))


def test_help_of_each_mode_documents_the_exit_status(capsys: pytest.CaptureFixture[str]) -> None:
    for p in (cli.parser(), cli.doctor_parser(), cli.replay_parser("vtop replay")):
        text = p.format_help().replace("\n", " ")
        text = " ".join(text.split())
        assert "0 OK, 1 warning" in text and "2 critical" in text and "3 unknown" in text, p.prog


def _dests(p: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {a.dest: a for a in p._actions}


def test_every_threshold_flag_is_taken_by_every_mode_alike() -> None:
    """One definition (THRESHOLD_FLAGS) for the screen and --once, doctor and replay."""
    names = [d for _, d, _ in cli.THRESHOLD_FLAGS]
    assert {"stall_threshold", "runaway_threshold"} <= set(names)
    ref = _dests(cli.parser())
    for p in (cli.doctor_parser(), cli.replay_parser("vtop replay")):
        got = _dests(p)
        for d in names:
            assert d in got, (p.prog, d)  # doctor had no --stall-threshold
            assert got[d].option_strings == ref[d].option_strings and got[d].help == ref[d].help


def test_doctor_passes_the_thresholds_to_its_config(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = {}

    def fake_run_once(cfg, **kw):  # type: ignore[no-untyped-def]
        seen["cfg"], seen["kw"] = cfg, kw
        return 0

    monkeypatch.setenv("XDG_CONFIG_HOME", "/nonexistent")
    monkeypatch.setattr("vtop.faces.headless.run_once", fake_run_once)
    rc = cli.main(["doctor", "http://127.0.0.1:9", "--stall-threshold", "60s", "--runaway-threshold", "45s",
                   "--window", "5", "--no-gpu"])
    assert rc == 0
    cfg = seen["cfg"]
    assert cfg.stall_threshold == 60.0 and cfg.runaway_threshold == 45.0 and cfg.urls == ("http://127.0.0.1:9",)
    assert seen["kw"]["window_s"] == 5.0 and seen["kw"]["doctor"] is True
    rc = cli.main(["--once", "http://127.0.0.1:9", "--stall-threshold", "60s", "--no-gpu"])
    assert seen["cfg"].stall_threshold == 60.0
    with pytest.raises(SystemExit) as e:
        cli.main(["doctor", "--stall-threshold", "soon"])
    assert e.value.code == EXIT_UNKNOWN


def test_replay_doctor_takes_the_thresholds(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = {}

    def fake(path, cfg, **kw):  # type: ignore[no-untyped-def]
        seen["cfg"] = cfg
        return 0

    monkeypatch.setattr("vtop.faces.headless.replay_doctor", fake)
    assert cli.main(["replay", "x.jsonl", "--doctor", "--runaway-threshold", "30s", "--stall-threshold", "90s"]) == 0
    assert seen["cfg"].runaway_threshold == 30.0 and seen["cfg"].stall_threshold == 90.0
