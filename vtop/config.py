"""vtop's settings: defaults < TOML config file < ``VTOP_*`` environment < flags.

One frozen :class:`Config` is built at start (by :mod:`vtop.cli`) and handed
to every part; nothing else reads the environment or the config file.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

MIN_INTERVAL_S = 0.25


class ConfigError(ValueError):
    """A setting that cannot be used; the message names it and says why."""


@dataclass(frozen=True)
class Config:
    urls: tuple[str, ...] = ()
    """vLLM servers to watch; empty means discover them on this box."""
    interval: float = 1.0
    """Seconds between polls (at least 0.25)."""
    history: float = 300.0
    """Seconds of history the sparklines show."""
    no_gpu: bool = False
    """Do not touch NVML at all."""
    simulate_gpus: int = 0
    """Simulated GPUs instead of NVML (benchmarks and demos)."""
    record: str | None = None
    """Append every sample to this JSONL file."""
    record_max_mb: int = 200
    """The recording stops growing at this size (MB); nothing before is lost."""
    redact_prompts: bool = True
    """Remove prompt text from log lines copied into recordings and snapshots."""
    runaway_threshold: float = 120.0
    """Seconds with requests running and none finishing before a runaway decode is flagged."""
    theme: str | None = None
    """A Textual theme name, e.g. ``ansi-dark`` to use the terminal's own palette."""
    log: str | None = None
    """The vLLM log to follow (a path, or ``-`` for standard input)."""
    api_key: str | None = field(default=None, repr=False)
    """Bearer token for the server's /v1 endpoints (else VLLM_API_KEY, else the server's --api-key). Never shown."""
    readonly: bool = False
    """Disable the action keys (snapshot, py-spy, test request)."""
    snapshot_dir: str = "."
    """Where the snapshot key writes its incident bundles."""
    stall_threshold: float = 600.0
    """Seconds without a log line or progress before a start is flagged as a possible hang."""
    start_history: bool = True
    """Keep each start's phase times in ``$XDG_STATE_HOME/vtop/starts.json`` and judge a start against its
    history (``start_history = false`` in the config file turns it off)."""
    prometheus_url: str | None = None
    """Read a fleet from this Prometheus-compatible API instead of polling servers (``--prometheus``)."""
    prometheus_token: str | None = field(default=None, repr=False)
    """Bearer token for Prometheus (config or VTOP_PROMETHEUS_TOKEN only: a flag shows in ps). Never shown."""
    prometheus_user: str | None = None
    """Basic-auth user for Prometheus (config or VTOP_PROMETHEUS_USER)."""
    prometheus_password: str | None = field(default=None, repr=False)
    """Basic-auth password for Prometheus (config or VTOP_PROMETHEUS_PASSWORD only). Never shown."""
    prometheus_ca_file: str | None = None
    """A CA bundle to verify Prometheus' TLS certificate with (verification is always on)."""
    prometheus_timeout: float = 3.0
    """Deadline of one Prometheus query, seconds."""
    fleet_interval: float = 5.0
    """Seconds between refreshes of the fleet from Prometheus."""
    on_alert: str | None = field(default=None, repr=False)
    """A command run (``sh -c``) at each start, severity change and clear of an incident: the alert as
    JSON on its stdin and in ``VTOP_ALERT_*`` variables (:mod:`vtop.actions.alerts_out`)."""
    webhook: tuple[str, ...] = field(default=(), repr=False)
    """URLs posted to at each start, severity change and clear of an incident: vtop's JSON, Slack's or
    ntfy's format by the host or a ``slack:``/``ntfy:``/``json:`` prefix. Secrets: never shown whole."""
    alert_min_severity: str = "warning"
    """The least severity an incident must reach to be delivered (``info``, ``warning``, ``critical``)."""
    alert_delivery: bool = True
    """False (``--no-alert-delivery``): this vtop delivers nothing, whatever ``on_alert`` and ``webhook`` say
    (a screen beside a ``vtop watch`` service that reads the same config; every tab of ``vtop web``)."""
    config_path: str | None = field(default=None, compare=False)
    """Which config file was read (for the help screen); not a setting."""
    url_auth: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    """The ``user:password`` of each URL given with one, by the URL as shown (``urls`` holds them with
    the password as ``***``: every face, file and log gets that form). Only the HTTP client reads
    this (:meth:`credentials_for`); not a setting. Never shown."""

    def credentials_for(self, url: str) -> str | None:
        """The ``user:password`` given in ``url`` (as the monitor knows it: normalised, masked), or None."""
        key = url.strip().rstrip("/")
        return next((cred for u, cred in self.url_auth if u == key), None)


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|min|h)?\s*$", re.I)


def parse_duration(value: Any, name: str) -> float:
    """``"300"``, ``"90s"``, ``"5m"``, ``"1h"``, ``"250ms"`` or a number -> seconds."""
    if isinstance(value, bool):
        raise ConfigError(f"{name}: expected a duration like 5m or 30s, got {value!r}")
    if isinstance(value, (int, float)):
        n = float(value)
        # TOML has nan and inf, and float("nan") compares false with every bound: an
        # interval of nan once passed validation and spun the poll loop at 97 % CPU.
        if not math.isfinite(n) or n < 0:
            raise ConfigError(f"{name}: expected a finite, non-negative duration, got {value!r}")
        return n
    m = _DURATION.match(str(value))
    if not m:
        raise ConfigError(f"{name}: expected a duration like 5m, 30s or 0.5, got {value!r}")
    n = float(m.group(1))
    unit = (m.group(2) or "s").lower()
    return n * {"ms": 0.001, "s": 1, "m": 60, "min": 60, "h": 3600}[unit]


def _parse_bool(value: Any, name: str) -> bool:
    if isinstance(value, bool):
        return value
    s = str(value).strip().lower()
    if s in ("1", "true", "yes", "on"):
        return True
    if s in ("0", "false", "no", "off", ""):
        return False
    raise ConfigError(f"{name}: expected true or false, got {value!r}")


def _coerce(name: str, value: Any) -> Any:
    if name in ("interval", "history", "stall_threshold", "runaway_threshold", "prometheus_timeout", "fleet_interval"):
        return parse_duration(value, name)
    if name in ("no_gpu", "readonly", "redact_prompts", "alert_delivery"):
        return _parse_bool(value, name)
    if name == "record_max_mb":
        try:
            n = int(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{name}: expected a whole number of MB, got {value!r}") from None
        if n < 1:
            raise ConfigError(f"{name}: expected at least 1, got {n}")
        return n
    if name == "simulate_gpus":
        try:
            n = int(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{name}: expected a whole number, got {value!r}") from None
        if not 0 <= n <= 64:
            raise ConfigError(f"{name}: expected 0 to 64, got {n}")
        return n
    if name == "webhook":
        if isinstance(value, str):
            value = [u for u in value.split() if u]
        if not isinstance(value, (list, tuple)) or not all(isinstance(u, str) for u in value):
            raise ConfigError("webhook: expected a list of URLs")
        for u in value:
            _check_webhook(u)
        return tuple(value)
    if name == "alert_min_severity":
        if str(value).strip().lower() not in ("info", "warning", "critical"):
            raise ConfigError(f"alert_min_severity: info, warning or critical, got {value!r}")
        return str(value).strip().lower()
    if name == "urls":
        if isinstance(value, str):
            value = [u for u in re.split(r"[,\s]+", value) if u]
        if not isinstance(value, (list, tuple)) or not all(isinstance(u, str) for u in value):
            raise ConfigError(f"urls: expected a list of URLs, got {value!r}")
        for u in value:
            _check_url(u)
        return tuple(value)
    if value is not None and not isinstance(value, str):
        raise ConfigError(f"{name}: expected text, got {value!r}")
    return value


def _check_url(url: str) -> None:
    """A URL vtop can poll: a scheme of http or https, a host, a port that is a number.

    ``http://[::1`` once got through and the server's card waited for its first poll
    forever (``--once`` ended in a ValueError traceback)."""
    from urllib.parse import urlsplit

    s = url.strip()
    if s.isdigit() or (s.startswith(":") and s[1:].isdigit()):
        return  # a bare port: localhost (vtop.sources.urls.normalize_url)
    try:
        u = urlsplit(s if "://" in s else "http://" + s)
        port = u.port
    except ValueError as e:
        raise ConfigError(f"URL {_shown_url(url)!r}: not a URL vtop can poll ({e})") from None
    if u.scheme not in ("http", "https"):
        raise ConfigError(f"URL {_shown_url(url)!r}: vtop polls http:// or https:// URLs, not {u.scheme}://")
    if not u.hostname:
        raise ConfigError(f"URL {_shown_url(url)!r}: no host in it")
    if port == 0:
        raise ConfigError(f"URL {_shown_url(url)!r}: port 0 is not a port a server listens on")


def _shown_url(url: str) -> str:
    """``url`` as a message shows it (:func:`vtop.model.redact.redact_url`). The redaction module (some twenty
    patterns) is imported where a URL has credentials or is refused, not by every start (issue 43)."""
    if "@" not in url:
        return url
    from vtop.model.redact import redact_url

    return redact_url(url)


def _check_webhook(spec: str) -> None:
    """A ``--webhook`` vtop can post to (an optional ``slack:``/``ntfy:``/``json:`` prefix, then an http(s)
    URL with a host). The message shows the URL only as :func:`vtop.model.redact.redact_webhook` does:
    its path and query are its secret."""
    from urllib.parse import urlsplit

    from vtop.model.redact import redact_webhook

    shown = redact_webhook(spec)
    head, colon, tail = spec.strip().partition(":")
    prefix = head.lower() if colon and head.lower() in ("slack", "ntfy", "json") and not tail.startswith("//") else ""
    url = tail if prefix else spec.strip()
    try:
        u = urlsplit(url)
        _ = u.port
    except ValueError:
        raise ConfigError(f"webhook {shown}: not a URL") from None
    if u.scheme not in ("http", "https") or not u.hostname:
        raise ConfigError(f"webhook {shown}: expected http(s)://HOST/..., with slack:, ntfy: or json: before it "
                          "to choose the format")
    host = u.hostname.lower()
    ntfy = prefix == "ntfy" if prefix else host == "ntfy.sh" or host.startswith("ntfy.")
    if ntfy and not u.path.strip("/"):
        raise ConfigError(f"webhook {shown}: an ntfy URL names its topic (https://ntfy.sh/TOPIC)")


SETTINGS = tuple(f.name for f in fields(Config) if f.name not in ("config_path", "url_auth"))


def default_config_path(env: Mapping[str, str]) -> Path:
    base = env.get("XDG_CONFIG_HOME") or str(Path(env.get("HOME", "~")).expanduser() / ".config")
    return Path(base) / "vtop" / "config.toml"


def load_file(path: Path) -> dict[str, Any]:
    try:
        f = path.open("rb")
    except FileNotFoundError:
        return {}
    except OSError as e:
        raise ConfigError(f"config file {path}: cannot read it ({e.strerror})") from None
    # Imported only when there is a file: a start without one (most) does not
    # wait for the TOML parser (~7 ms on the VM).
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - exercised on 3.10 only
        import tomli as tomllib
    try:
        with f:
            data = tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file {path}: not valid TOML ({e})") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"config file {path}: not UTF-8 text (byte {e.start}); TOML files are UTF-8") from None
    except OSError as e:
        raise ConfigError(f"config file {path}: cannot read it ({e.strerror})") from None
    unknown = sorted(set(data) - set(SETTINGS))
    if unknown:
        raise ConfigError(f"config file {path}: unknown setting(s) {', '.join(unknown)}; known: {', '.join(SETTINGS)}")
    return data


def from_env(env: Mapping[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in SETTINGS:
        key = "VTOP_" + name.upper()
        if key in env:
            out[name] = env[key]
    return out


def build(
    flags: Mapping[str, Any], env: Mapping[str, str] | None = None, config_file: str | None = None
) -> Config:
    """Merge the layers; ``flags`` holds only the flags the user actually gave."""
    env = os.environ if env is None else env
    path = Path(config_file).expanduser() if config_file else default_config_path(env)
    if config_file and not path.exists():
        raise ConfigError(f"config file {path} does not exist")
    merged: dict[str, Any] = {}
    for layer in (load_file(path), from_env(env), dict(flags)):
        for k, v in layer.items():
            merged[k] = _coerce(k, v)
    cfg = Config(**merged, config_path=str(path) if path.exists() else None)
    if any("@" in u for u in cfg.urls):
        cfg = _split_credentials(cfg)
    if cfg.interval < MIN_INTERVAL_S:
        raise ConfigError(f"interval: at least {MIN_INTERVAL_S} s, got {cfg.interval:g}")
    if cfg.no_gpu and cfg.simulate_gpus:
        raise ConfigError(f"no_gpu and simulate_gpus ({cfg.simulate_gpus}) were both given: use one "
                          "(--no-gpu shows no GPU; --simulate-gpus N shows N made-up ones)")
    if cfg.fleet_interval < 1.0 or cfg.prometheus_timeout <= 0:
        raise ConfigError(f"fleet_interval: at least 1 s (got {cfg.fleet_interval:g}); prometheus_timeout: more "
                          f"than 0 (got {cfg.prometheus_timeout:g})")
    if cfg.history < 10 * cfg.interval:
        raise ConfigError(f"history: at least 10 intervals ({10 * cfg.interval:g} s), got {cfg.history:g}")
    return cfg


def _split_credentials(cfg: Config) -> Config:
    """The one place URLs enter: a password in one (``http://user:pw@host:8000``) is kept aside for
    the HTTP client and the URL goes on as ``http://user:***@host:8000``, so the report, ``--json``,
    the recording, the bundle, the screen and the exporter can only show the masked form."""
    urls, auth = [], []
    for u in cfg.urls:
        shown, userinfo = _split_userinfo(u.strip())
        urls.append(shown)
        if userinfo is not None:
            auth.append((shown.rstrip("/"), userinfo))  # a URL with a user has a scheme: normalised but for the /
    return dataclasses.replace(cfg, urls=tuple(urls), url_auth=tuple(auth))


def _split_userinfo(url: str) -> tuple[str, str | None]:
    """:func:`vtop.model.redact.split_userinfo`, imported only for a URL that may hold credentials (an ``@``:
    without one it gives ``(url, None)`` itself)."""
    if "@" not in url:
        return url, None
    from vtop.model.redact import split_userinfo

    return split_userinfo(url)


def api_key_refusal(prog: str, env: Mapping[str, str] | None = None) -> str:
    """The one line ``--api-key KEY`` on a command line gets: every user of the box reads a process's
    arguments in ``ps``, so the key comes from the environment or the config file (0600) only, as
    ``--prometheus``'s credentials do."""
    path = default_config_path(os.environ if env is None else env)
    return (f"{prog}: error: --api-key on the command line is visible to every user of this box in `ps`; "
            f"set VLLM_API_KEY (or VTOP_API_KEY) in the environment, or api_key = \"...\" in the config "
            f"file ({path}, or the one --config names)\n")


def add_api_key_flag(p: Any, exit_status: int) -> None:
    """``--api-key`` on an argparse parser: named in ``--help`` so it is found, refused when given
    (:func:`api_key_refusal`), before anything else runs and without echoing the key."""
    import argparse

    class Refuse(argparse.Action):
        def __call__(self, parser: argparse.ArgumentParser, namespace: Any, values: Any,
                     option_string: str | None = None) -> None:
            parser.exit(exit_status, api_key_refusal(parser.prog))

    p.add_argument("--api-key", action=Refuse, default=argparse.SUPPRESS, metavar="KEY",
                   help="refused: the server's /v1 bearer token comes from $VLLM_API_KEY (or $VTOP_API_KEY) or "
                        "api_key in the config file, never the command line (ps shows it to every user)")


def add_delivery_flags(p: Any) -> None:
    """``--on-alert``, ``--webhook``, ``--alert-min-severity``: the screen's and ``vtop watch``'s."""
    import argparse

    S = argparse.SUPPRESS
    p.add_argument("--on-alert", dest="on_alert", default=S, metavar="CMD",
                   help="run CMD (sh -c) when an incident starts, changes severity or clears: the alert as JSON on "
                        "its stdin and in VTOP_ALERT_EVENT (start, change, clear), _RULE, _SEVERITY, _TITLE, "
                        "_TARGET ...; off the tick, 10 s deadline, retried")
    p.add_argument("--webhook", dest="webhook", action="append", default=S, metavar="URL",
                   help="POST each start, severity change and clear to URL (repeatable): Slack's format for "
                        "hooks.slack.com, ntfy's for ntfy.sh (or ntfy.*), else vtop's JSON; a slack:, ntfy: or "
                        "json: prefix chooses; the URL is a secret: prefer the config file or VTOP_WEBHOOK "
                        "(ps shows flags)")
    p.add_argument("--no-alert-delivery", dest="alert_delivery", action="store_false", default=S,
                   help="deliver nothing from this vtop (a screen beside a `vtop watch` service with the same "
                        "config; vtop web's tabs)")
    p.add_argument("--alert-min-severity", dest="alert_min_severity", default=S,
                   choices=("info", "warning", "critical"),
                   help="deliver incidents that reach this severity (default warning)")


def replace(cfg: Config, **changes: Any) -> Config:
    return dataclasses.replace(cfg, **changes)
