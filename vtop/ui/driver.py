"""A terminal driver whose key-reading thread sleeps while nobody types.

Textual's Linux driver reads keys in a thread that waits on stdin with a 0.1 s
timeout, so that a lone ESC (which may start an escape sequence) is let
through 0.1 s later. It also wakes ten times a second when nothing happens:
py-spy put that loop at 9 % of vtop's own CPU with 8 GPUs and 2 servers, and it
is most of what an idle vtop costs. A monitor left open on a box for days
should not tick for nothing.

:class:`CalmSelector` stands in for the selector that thread creates: while
input arrived in the last second it waits as asked (0.1 s, so ESC works as
before); otherwise it waits up to 1 s. Quitting must not wait for that second,
so the selector also watches a pipe that :meth:`CalmLinuxDriver.disable_input`
writes to before Textual stops the thread.

This swaps one name in ``textual.drivers.linux_driver`` (its ``selectors``
module reference) for the life of the process: Textual's internals, so it is
kept to this one module and used only with the Textual releases it was tested
on (:data:`TESTED_TEXTUAL`); with any other, vtop runs Textual's own driver.
tests/unit/test_calm_driver.py fails loudly when the installed Textual is not
in that list (bump it after checking the driver still reads keys as below).

What it saves, by the project's accounting: the key thread's 10 wake-ups a
second were ~9 % of vtop's own CPU with 8 GPUs + 2 servers (py-spy, the dev VM),
about 0.05-0.08 % of a core. The upstream fix would be a driver option for
the idle timeout of the input thread.
"""

from __future__ import annotations

import os
import selectors
import time
import types
from typing import Any

#: Textual releases this module was tested with (``textual.__version__``)
TESTED_TEXTUAL = ("8.2.8",)

IDLE_TIMEOUT_S = 1.0
ACTIVE_WINDOW_S = 1.0
_WAKE = "vtop-wake"


class CalmSelector:
    """A ``SelectSelector`` that waits longer while there is no input (see the module doc)."""

    def __init__(self, wake_fd: int | None = None) -> None:
        self._sel = selectors.SelectSelector()
        self._wake_fd = wake_fd
        if wake_fd is not None:
            self._sel.register(wake_fd, selectors.EVENT_READ, _WAKE)
        self._last_input = time.monotonic()
        self.waits: list[float | None] = []  # the timeouts used (tests); bounded below

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._sel.register(fileobj, events, data)

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._sel.unregister(fileobj)

    def close(self) -> None:
        self._sel.close()

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is not None and time.monotonic() - self._last_input > ACTIVE_WINDOW_S:
            timeout = max(timeout, IDLE_TIMEOUT_S)
        if len(self.waits) < 64:
            self.waits.append(timeout)
        out = []
        for key, mask in self._sel.select(timeout):
            if key.data == _WAKE:
                try:
                    os.read(key.fd, 512)
                except OSError:
                    pass
                self._last_input = time.monotonic()  # answer the stop quickly from now on
                continue
            out.append((key, mask))
        if out:
            self._last_input = time.monotonic()
        return out


def installed_version(dist: str, module_file: str) -> str | None:
    """The version of the installed distribution ``dist`` whose package ``module_file`` is in, from the
    name of its ``.dist-info`` folder beside the package (``{name}-{version}.dist-info``: the layout the
    PyPA's "Recording installed projects" spec gives every installer); None where that folder is not
    there or not alone (an editable install, a copied tree, two installs on top of each other).

    Why not ``importlib.metadata.version``: importing it brings ``email``, ``zipfile``, ``csv`` and 30 more
    modules that nothing else in vtop needs: 1.6 MB of the dashboard's resident memory and 18 ms of its
    start on the dev VM (Python 3.11, Textual 8.2.8), to read one version string. Textual's own
    ``__version__`` reads it the same way."""
    import re
    from pathlib import Path

    here = Path(module_file).resolve()
    site = here.parent.parent if here.name == "__init__.py" else here.parent  # a package, or one module
    want = re.sub(r"[-_.]+", "_", dist).lower()
    found = []
    for p in site.glob("*.dist-info"):
        name, _, version = p.name[: -len(".dist-info")].rpartition("-")
        if re.sub(r"[-_.]+", "_", name).lower() == want:
            found.append(version)
    return found[0] if len(found) == 1 else None


def textual_is_tested() -> bool:
    """Whether the installed Textual is one :class:`CalmSelector` was tested with."""
    import textual

    return installed_version("textual", textual.__file__) in TESTED_TEXTUAL


def calm_driver_class() -> Any:
    """The Linux driver with a calm key thread, or None where Textual would not use it."""
    import sys

    if not sys.platform.startswith("linux") or not textual_is_tested():
        return None
    try:
        from textual.drivers import linux_driver
    except ImportError:
        return None
    if not hasattr(linux_driver, "selectors") or not hasattr(linux_driver.LinuxDriver, "run_input_thread"):
        return None  # a Textual that reads keys differently: keep its own driver

    class CalmLinuxDriver(linux_driver.LinuxDriver):
        _vtop_wake: int | None = None

        def run_input_thread(self) -> None:
            r, w = os.pipe()
            self._vtop_wake = w
            shim = types.SimpleNamespace(**{k: getattr(selectors, k) for k in dir(selectors) if not k.startswith("__")})
            shim.SelectSelector = lambda: CalmSelector(r)
            linux_driver.selectors = shim  # type: ignore[assignment] # the one swap (module doc)
            try:
                super().run_input_thread()
            finally:
                for fd in (r, w):
                    try:
                        os.close(fd)
                    except OSError:
                        pass
                self._vtop_wake = None

        def disable_input(self) -> None:
            w = getattr(self, "_vtop_wake", None)
            if w is not None:
                try:
                    os.write(w, b"x")
                except OSError:
                    pass
            super().disable_input()

    return CalmLinuxDriver
