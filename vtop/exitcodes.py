"""vtop's exit status: the convention of the monitoring plugins (Nagios, Icinga, Sensu checks).

``vtop --once``, ``vtop doctor`` and ``vtop replay FILE --doctor`` exit with:

* 0 **OK**: nothing is wrong;
* 1 **warning**: an alert of warning severity (a runaway seen as a warning, KV pressure...);
* 2 **critical**: a critical alert, or a watched server down or its engine dead;
* 3 **unknown**: vtop could not look: bad usage, a bad config, a recording it cannot
  read, no source answered in the window, a source that never answered (a hung NVML
  call) or stopped answering partway (NVML hung mid-window: its readings are stale), or a watched server that never gave vLLM's numbers (its /metrics answers HTML,
  404, 302, 500, another exporter's names, or over 16 MiB).

A server that accepts connections and does not answer (a blocked API-server event loop)
is an alert (``api_unresponsive``): warning, then critical.

So ``vtop doctor || page-someone`` pages on a warning too, and a check runner maps the
status as it does for its plugins. Bad usage of the screen exits 3 as well. A leaf:
imports nothing of vtop's.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

EXIT_OK, EXIT_WARNING, EXIT_CRITICAL, EXIT_UNKNOWN = 0, 1, 2, 3
EXIT_USAGE = EXIT_UNKNOWN

EXIT_HELP = ("exit status: 0 OK, 1 warning (a warning alert), 2 critical (a critical alert, or a server "
             "down / its engine dead), 3 unknown (bad usage or config, no source answered, a source that never answered "
             "or stopped answering, "
             "or a server whose /metrics is not vLLM's)")


class UsageParser(argparse.ArgumentParser):
    """argparse, with bad usage ending in exit status 3 (unknown) instead of argparse's 2, which the
    plugin convention keeps for critical: the parser of the screen and of every face."""

    def error(self, message: str) -> Any:
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")
