"""Between the sources and every face: one pipeline, no Textual (see :mod:`vtop.monitor.monitor`)."""

from vtop.monitor.monitor import ALERTS, GPU, LOG, LOG_SOURCE, SERVERS, AlertChange, Monitor, WatchedServer

__all__ = ["ALERTS", "GPU", "LOG", "LOG_SOURCE", "SERVERS", "AlertChange", "Monitor", "WatchedServer"]
