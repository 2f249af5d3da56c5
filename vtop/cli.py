"""Command line: flags -> :class:`~vtop.config.Config` -> the app (or a headless mode).

All of vtop's flags live in this one module. A flag that is not given does not
override the config file or the environment (``argparse.SUPPRESS`` defaults).
Bad input ends with one ``vtop: error: ...`` line and exit status 3, never a
traceback.

Exit status, the convention of the monitoring plugins (Nagios, Icinga, Sensu
checks), for ``vtop --once``, ``vtop doctor`` and ``vtop replay FILE --doctor``:
0 OK, 1 warning (an alert of warning severity), 2 critical (a critical alert, or
a watched server down or its engine dead), 3 unknown (vtop could not look: bad
usage, a bad config, a recording it cannot read, or no source answered). Bad
usage of the screen itself exits 3 too.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

from vtop import __version__
from vtop.config import MIN_INTERVAL_S, ConfigError, add_api_key_flag, add_delivery_flags, build, parse_duration
from vtop.exitcodes import EXIT_HELP, EXIT_USAGE, UsageParser

S = argparse.SUPPRESS


Parser = UsageParser  # bad usage exits 3 (vtop/exitcodes.py)


def _duration(name: str) -> Any:
    def conv(v: str) -> float:
        try:
            return parse_duration(v, name)
        except ConfigError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    return conv


#: The diagnosis thresholds as flags: (flag, Config field, help). One definition, added to
#: every parser that diagnoses (the screen and ``--once``, ``doctor``, ``replay``), so a flag
#: works the same in each; a flag not given leaves the config file and environment alone.
THRESHOLD_FLAGS = (
    ("--stall-threshold", "stall_threshold",
     "flag a start that prints nothing and makes no progress this long (default 10m)"),
    ("--runaway-threshold", "runaway_threshold",
     "flag a runaway decode after this long with nothing finishing (default 2m); a request "
     "/metrics shows running min(45s, this) while others finish is flagged too"),
)


def add_threshold_flags(p: argparse.ArgumentParser) -> None:
    for flag, dest, text in THRESHOLD_FLAGS:
        p.add_argument(flag, dest=dest, type=_duration(dest), default=S, metavar="DURATION", help=text)


def threshold_values(ns: argparse.Namespace) -> dict[str, Any]:
    """The threshold flags given (as Config fields)."""
    return {dest: getattr(ns, dest) for _, dest, _ in THRESHOLD_FLAGS if hasattr(ns, dest)}


def add_prometheus_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prometheus", dest="prometheus_url", default=S, metavar="URL",
                   help="a fleet: every vLLM instance this Prometheus (or Thanos, Mimir, VictoriaMetrics) scrapes; "
                        "credentials only from the config or VTOP_PROMETHEUS_TOKEN / _USER / _PASSWORD; "
                        "refresh every 5 s (--interval)")


def _run_fleet(p: argparse.ArgumentParser, cfg: Any, given: dict[str, Any], *, once: bool, as_json: bool,
               window: float | None, doctor: bool) -> int:
    """The fleet face (``vtop.faces.headless_fleet``, ``vtop.ui.fleet_app``): a branch, not a copy."""
    from vtop.config import replace
    from vtop.sources.prometheus import check_prometheus_url

    try:
        check_prometheus_url(cfg.prometheus_url)
    except ValueError as e:
        p.exit(EXIT_USAGE, f"{p.prog}: error: {e}\n")
    if "interval" in given:
        cfg = replace(cfg, fleet_interval=max(1.0, cfg.interval))
    if once or as_json or doctor:
        from vtop.faces.headless_fleet import run_fleet_once

        return run_fleet_once(cfg, window_s=window if window is not None else 0.0, as_json=as_json, doctor=doctor)
    from vtop.ui.fleet_app import FleetApp

    return int(FleetApp(cfg).run() or 0)


def parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="vtop",
        description=("Live terminal dashboard for GPU boxes serving LLMs with vLLM. Also: vtop doctor "
                     "(watch a while, say what is wrong), vtop replay FILE (play a --record file), vtop demo "
                     "(a recorded H200 incident), vtop export (Prometheus metrics), vtop web (the screen in a browser), "
                     "vtop watch (headless: alerts to a command or webhooks); "
                     "each has --help."),
        epilog=(
            "Keys: ? help, space freeze, + - poll interval, / filter the log, e every alert, q quit. "
            "With --once (and vtop doctor, vtop replay --doctor), the " + EXIT_HELP + ". "
            "Settings also come from $XDG_CONFIG_HOME/vtop/config.toml (keys as the long flags, "
            "with _ for -) and VTOP_* environment variables (VTOP_INTERVAL=2); flags win. "
            "For SSH: TEXTUAL_COLOR_SYSTEM=256, NO_COLOR=1 and --theme ansi-dark are honoured."
        ),
    )
    p.add_argument("urls", nargs="*", metavar="URL", default=S, help="vLLM server(s) to watch, e.g. http://localhost:8000")
    p.add_argument("--interval", type=_duration("interval"), default=S, metavar="SECONDS",
                   help=f"seconds between polls (default 1, at least {MIN_INTERVAL_S})")
    p.add_argument("--history", type=_duration("history"), default=S, metavar="DURATION",
                   help="time window of the sparklines, e.g. 5m (default), 90s, 1h")
    p.add_argument("--no-gpu", dest="no_gpu", action="store_true", default=S, help="do not use NVML at all")
    p.add_argument("--simulate-gpus", dest="simulate_gpus", type=int, default=S, metavar="N",
                   help="N simulated GPUs instead of NVML (for demos and benchmarks)")
    p.add_argument("--record", default=S, metavar="FILE", help="append every sample to FILE (JSONL; .gz compresses)")
    p.add_argument("--log", default=S, metavar="PATH",
                   help="the vLLM log to follow; - reads standard input (docker logs -f C 2>&1 | vtop --log -)")
    add_api_key_flag(p, EXIT_USAGE)
    p.add_argument("--readonly", action="store_true", default=S,
                   help="disable the action keys (snapshot, py-spy dump, test request)")
    p.add_argument("--snapshot-dir", dest="snapshot_dir", default=S, metavar="DIR",
                   help="where s writes incident bundles (default: the current directory)")
    p.add_argument("--theme", default=S, help="Textual theme, e.g. ansi-dark to use the terminal's own colours")
    p.add_argument("--once", action="store_true", default=S,
                   help="print one plain-text snapshot (GPUs, servers, startup, alerts) and exit; "
                        "exit 0 OK, 1 warning, 2 critical (or a server down), 3 unknown")
    p.add_argument("--json", action="store_true", default=S,
                   help="with --once (implied): the snapshot as JSON, schema vtop.report/2")
    p.add_argument("--window", type=_duration("window"), default=S, metavar="DURATION",
                   help="--once: watch this long before printing, to measure rates (tokens/s, preemptions/s, "
                        "latencies need two scrapes; 2s is enough). Default: no window, one round of readings "
                        "(queues, KV cache, GPUs, phase, alerts) at once; rates only from the log's last stats line")
    p.add_argument("--record-max-mb", dest="record_max_mb", type=int, default=S, metavar="MB",
                   help="the recording stops growing at this size (default 200)")
    p.add_argument("--redact-prompts", dest="redact_prompts", action=argparse.BooleanOptionalAction, default=S,
                   help="remove prompt text from log lines in recordings and snapshots (default: on)")
    add_threshold_flags(p)
    add_prometheus_flag(p)
    add_delivery_flags(p)
    p.add_argument("--config", dest="config_file", default=None, metavar="FILE", help="config file to read instead of the default")
    p.add_argument("--version", action="version", version=f"vtop {__version__}")
    return p


SUBCOMMANDS = ("replay", "demo", "doctor", "export", "web", "watch")


def _write_csv(path: str, out: str) -> int:
    """``replay FILE --csv [OUT]``; OSError/ValueError go to the caller's plain message."""
    import sys

    from vtop.faces.export_csv import write_csv

    if out == "-":
        try:
            write_csv(path, sys.stdout)
            sys.stdout.flush()
        except BrokenPipeError:  # `| head`: the reader has what it wanted
            import os

            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    with open(out, "w", newline="", encoding="utf-8") as f:
        n = write_csv(path, f)
    print(f"{out}: {n} rows", file=sys.stderr)
    return 0


def replay_parser(prog: str) -> argparse.ArgumentParser:
    demo = prog.endswith("demo")
    p = Parser(
        prog=prog,
        description=("Play vtop's demo: a real vLLM 0.26.0 on an H200 starting up, serving a burst and a "
                     "runaway request, recorded by vtop itself." if demo else
                     "Play a recording made with vtop --record in the same UI, on the recorded clock."),
        epilog=("Keys: space pause, . step, + - speed, left/right 10 s, [ ] 1 min, home/end, 1-9 or n/N "
                "chapters, ? help, q quit. "
                "With --doctor, " + EXIT_HELP + "."),
    )
    if not demo:
        p.add_argument("file", metavar="FILE", help="a recording (JSONL, or .gz)")
    p.add_argument("--speed", type=float, default=10.0 if demo else 1.0, help="1 to 60 (default %(default)s)")
    p.add_argument("--paused", action="store_true", help="start paused at the beginning")
    p.add_argument("--theme", default=S, help="Textual theme, e.g. ansi-dark")
    p.add_argument("--doctor", action="store_true",
                   help="no screen: play the whole recording through the monitor at once and print when each "
                        "alert came and went, then the report at its end (exit status as vtop doctor)")
    p.add_argument("--json", action="store_true", help="with --doctor: print that as JSON")
    p.add_argument("--csv", nargs="?", const="-", metavar="OUT",
                   help="no screen: write the recording's GPU and server samples as CSV (a header row, one row "
                        "per GPU per poll and per server poll; empty where there is no value) to OUT, or to "
                        "stdout")
    add_threshold_flags(p)
    return p


def doctor_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="vtop doctor",
        description=("Watch for a short window, then say what is wrong and what to do. The vLLM log's "
                     "last minutes (its stats lines, request lines, phase lines) are read too, so an "
                     "incident that began before the window is named."),
        epilog=EXIT_HELP + ". So `vtop doctor || page-someone` pages on a warning too.",
    )
    p.add_argument("urls", nargs="*", metavar="URL", default=S,
                   help="vLLM server(s); default: the ones running on this box")
    p.add_argument("--window", type=_duration("window"), default=15.0, metavar="DURATION",
                   help="how long to watch (default 15s)")
    p.add_argument("--json", action="store_true", help="print the report as JSON (schema vtop.report/2)")
    p.add_argument("--log", default=S, metavar="PATH", help="the vLLM log (default: found from the process)")
    p.add_argument("--interval", type=_duration("interval"), default=S, metavar="SECONDS",
                   help="seconds between polls (default 1)")
    p.add_argument("--no-gpu", dest="no_gpu", action="store_true", default=S, help="do not use NVML")
    add_api_key_flag(p, EXIT_USAGE)
    add_threshold_flags(p)
    add_prometheus_flag(p)
    p.add_argument("--record", default=S, metavar="FILE", help="also record the window to FILE")
    p.add_argument("--config", dest="config_file", default=None, metavar="FILE",
                   help="config file to read instead of the default")
    return p


def _run_doctor(argv: Sequence[str], program: bool = False) -> int:
    """``vtop doctor``; ``program``: run as the program (it exits when this returns)."""
    p = doctor_parser()
    ns = vars(p.parse_args(argv))
    window = ns.pop("window")
    as_json = ns.pop("json")
    config_file = ns.pop("config_file", None)
    if "urls" in ns:
        ns["urls"] = tuple(ns["urls"])
    try:
        cfg = build(ns, config_file=config_file)
    except ConfigError as e:
        p.exit(EXIT_USAGE, f"vtop doctor: error: {e}\n")
    if window <= 0:
        p.exit(EXIT_USAGE, "vtop doctor: error: --window must be positive\n")
    if cfg.log == "-":
        p.exit(EXIT_USAGE, "vtop doctor: error: doctor cannot read the log from standard input; pass --log PATH\n")
    if cfg.prometheus_url:
        return _run_fleet(p, cfg, ns, once=True, as_json=as_json, window=window, doctor=True)
    from vtop import gc_tuning
    from vtop.faces.headless import run_once

    try:
        return run_once(cfg, window_s=window, as_json=as_json, doctor=True)
    except OSError as e:
        p.exit(EXIT_USAGE, f"vtop doctor: error: {e}\n")
    finally:
        if program:
            gc_tuning.before_exit()


def _run_replay(argv: Sequence[str], prog: str) -> int:
    p = replay_parser(prog)
    ns = p.parse_args(argv)
    if not 1 <= ns.speed <= 60:
        p.exit(EXIT_USAGE, f"{prog}: error: --speed: 1 to 60, got {ns.speed:g}\n")
    if prog.endswith("demo"):
        from vtop.faces.demo import demo_path

        path = str(demo_path())
    else:
        path = ns.file
    try:
        cfg = build({k: v for k, v in vars(ns).items() if k == "theme"} | threshold_values(ns), env={})
        if (why := theme_error(cfg.theme)) is not None:
            p.exit(EXIT_USAGE, f"{prog}: error: {why}\n")
        if ns.csv is not None:
            return _write_csv(path, ns.csv)
        if ns.doctor or ns.json:
            from vtop.faces.headless import replay_doctor

            return replay_doctor(path, cfg, as_json=ns.json)
        from vtop.ui.replay import replay_app

        app = replay_app(path, config=cfg, speed=ns.speed, name="demo" if prog.endswith("demo") else None,
                         demo=prog.endswith("demo"))
    except FileNotFoundError:
        p.exit(EXIT_USAGE, f"{prog}: error: {path}: no such file\n")
    except (OSError, ValueError, EOFError) as e:
        p.exit(EXIT_USAGE, f"{prog}: error: {path}: cannot play it: {e}\n")
    except ConfigError as e:
        p.exit(EXIT_USAGE, f"{prog}: error: {e}\n")
    if ns.paused and app.replay is not None:
        app.replay.paused = True
    return int(app.run() or 0)


def theme_error(name: str | None) -> str | None:
    """Why ``--theme NAME`` cannot be used, or None. Textual raised InvalidThemeError (a
    traceback) from inside the app for a name it does not know."""
    if not name:
        return None
    from textual.theme import BUILTIN_THEMES

    if name in BUILTIN_THEMES:
        return None
    return f"--theme: no theme {name!r}; known: {', '.join(sorted(BUILTIN_THEMES))}"


def limit_malloc_arenas() -> None:
    """One malloc arena for the whole process (glibc's ``M_ARENA_MAX``).

    glibc gives every thread that allocates its own arena, and each keeps what
    it touched resident. vtop's handful of poll threads (NVML, log, discovery,
    the recorder) allocate little, often: measured on the H200 machine, peak
    RSS was 93.4 MB with glibc's default and 80.8 MB with one arena, same
    screen. A monitor's threads barely contend, so one arena costs nothing
    measurable. Must run before any thread starts; a no-op off glibc.
    """
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        ctypes.CDLL(None).mallopt(-8, 1)  # M_ARENA_MAX = -8 in malloc.h
    except (OSError, AttributeError):
        pass


#: Textual's cap on screen updates a second (``TEXTUAL_FPS``, 60 by default), set before
#: Textual is imported unless the user set it. See :func:`textual_frame_rate`.
TEXTUAL_FPS = "120"


def textual_frame_rate() -> None:
    """Let Textual update the screen up to 120 times a second instead of 60.

    Textual draws on a timer that runs at most ``TEXTUAL_FPS`` times a second and,
    after each frame, sleeps until the next tick but one of its grid: a key pressed
    within ~33 ms of any frame (vtop draws one a second, and a pressed key's own
    follow-ups) waited up to 33 ms before its relayout began. bench/key_trace.py
    showed it as the slowest presses' gap (25-30 ms of 40-60 ms; the dev VM, a
    server hung). At 120 the wait is at most ~17 ms. vtop draws once a second
    either way; a faster cap only lets frames that are asked for sooner (a key, a
    scroll) come sooner, and Textual's animations keep their own 60 a second."""
    import os

    os.environ.setdefault("TEXTUAL_FPS", TEXTUAL_FPS)


def main(argv: Sequence[str] | None = None) -> int:
    limit_malloc_arenas()
    textual_frame_rate()
    # Run as the program (`vtop`, `python -m vtop`: no argv given), it exits when main returns, and a
    # one-shot may tune the collector for that (vtop.gc_tuning.one_shot); a caller's process is left as is.
    program = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("replay", "demo"):
        return _run_replay(argv[1:], f"vtop {argv[0]}")
    if argv and argv[0] == "doctor":
        return _run_doctor(argv[1:], program)
    if argv and argv[0] == "export":
        from vtop.faces.exporter import main as export_main

        return export_main(argv[1:])
    if argv and argv[0] == "watch":
        from vtop.faces.watch import main as watch_main

        return watch_main(argv[1:])
    if argv and argv[0] == "web":
        from vtop.faces.web import main as web_main

        return web_main(argv[1:], check_vtop_args=parser().parse_args)
    p = parser()
    ns = vars(p.parse_args(argv))
    config_file = ns.pop("config_file", None)
    once, as_json, window = ns.pop("once", False), ns.pop("json", False), ns.pop("window", None)
    try:
        cfg = build(ns, config_file=config_file)
    except ConfigError as e:
        p.exit(EXIT_USAGE, f"vtop: error: {e}\n")
    if cfg.prometheus_url:
        return _run_fleet(p, cfg, ns, once=once, as_json=as_json, window=window, doctor=False)
    dumb = not (once or as_json) and os.environ.get("TERM", "") == "dumb"
    if dumb:
        # TERM=dumb (Emacs shells, some CI consoles) cannot draw a full-screen app: Textual
        # drew it anyway, in 24-bit colour. Print the one-shot report instead, and say so.
        print("vtop: TERM=dumb cannot show the dashboard; printing vtop --once instead "
              "(set TERM=xterm-256color for the screen)", file=sys.stderr)
        once = True
    if (why := theme_error(cfg.theme)) is not None and not (once or as_json):
        p.exit(EXIT_USAGE, f"vtop: error: {why}\n")
    if once or as_json:
        if cfg.log == "-":
            p.exit(EXIT_USAGE, "vtop: error: --once cannot read the log from standard input; pass --log PATH\n")
        from vtop import gc_tuning

        if program:
            gc_tuning.one_shot(window)
        from vtop.faces.headless import run_once

        try:
            # No --window: one round of readings (the gauges at once; rates need a window).
            return run_once(cfg, window_s=window, as_json=as_json)
        except OSError as e:
            p.exit(EXIT_USAGE, f"vtop: error: {e}\n")
        finally:
            if program:
                gc_tuning.before_exit()
    log_fd = None
    if cfg.log == "-":
        try:
            log_fd = _stdin_for_log()
        except OSError as e:
            p.exit(EXIT_USAGE, f"vtop: error: --log - needs a terminal for the keys: {e.strerror or e}\n")
    from vtop.gc_tuning import hold_until_settled

    hold_until_settled()  # the app's third tick turns it back on (settle_gc)
    try:
        from vtop.ui.app import VtopApp

        app = VtopApp(cfg, log_fd=log_fd)
    except OSError as e:  # e.g. the --record file cannot be opened
        p.exit(EXIT_USAGE, f"vtop: error: {e}\n")
    rc = app.run()
    return int(rc or 0)


def _stdin_for_log() -> int:
    """``--log -``: keep the piped log on a new descriptor and give Textual the terminal.

    Textual reads keys from file descriptor 0. When the log arrives on stdin
    (``docker logs -f c | vtop --log -``), move the pipe to another descriptor
    and put ``/dev/tty`` on 0, so the keys still work.
    """
    import os

    log_fd = os.dup(0)
    tty = os.open("/dev/tty", os.O_RDONLY)
    os.dup2(tty, 0)
    os.close(tty)
    return log_fd


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
