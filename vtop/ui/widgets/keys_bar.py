"""The key hints on the bottom line: one line of text, drawn in the first frame.

Why not Textual's ``Footer``: it shows nothing until the screen has published
its bindings, then rebuilds itself (a widget per key) each time they are
published again; at start-up that happened three times after the first frame,
and the keys appeared a quarter of a second after the rest of the screen on
the 2-core box (``bench/run.py``'s first frame waits for them). Here the hints
are one ``Static`` made from the same active bindings: in the first frame,
redrawn only when the bindings change, and each key still clickable.

Shown as Textual's footer shows them: ``check_action`` False hides a key,
None dims it (read-only mode). When the line is too narrow for every key with
its label, labels are dropped from the last key back (``+ - . ...`` stay as keys)
until every key fits: a key is never cut off the end of the line.
"""

from __future__ import annotations

from typing import Any

from rich.cells import cell_len
from rich.text import Text
from textual.widgets import Static

from vtop.ui.widgets.styles import component_style


class KeysBar(Static):
    COMPONENT_CLASSES = {"keys-bar--key", "keys-bar--off"}

    def __init__(self, **kw: Any) -> None:
        super().__init__("", markup=False, **kw)
        self._keys: tuple[list[tuple[str, str, str, bool]], int] | None = None

    def on_mount(self) -> None:
        self.screen.bindings_updated_signal.subscribe(self, self._on_bindings)
        self.redraw()

    def on_unmount(self) -> None:
        self.screen.bindings_updated_signal.unsubscribe(self)

    def _on_bindings(self, screen: Any) -> None:
        if screen is self.screen:
            self.redraw()

    def keys(self) -> list[tuple[str, str, str, bool]]:
        """``(key as shown, description, key name, enabled)`` in binding order."""
        out: list[tuple[str, str, str, bool]] = []
        seen: set[str] = set()
        for _node, binding, enabled, _tip in self.screen.active_bindings.values():
            if not binding.show or binding.action in seen:
                continue
            seen.add(binding.action)
            out.append((self.app.get_key_display(binding), binding.description, binding.key, enabled))
        # help first, as htop's F1: the key a new user looks for, and the last to lose its label
        out.sort(key=lambda k: k[1] != "Help")
        return out

    def on_resize(self) -> None:
        self.redraw()

    @staticmethod
    def fit(keys: list[tuple[str, str, str, bool]], width: int) -> list[bool]:
        """Which keys keep their label in ``width`` cells: all if they fit, else labels
        dropped from the last key back until the keys alone fit."""
        labelled = [True] * len(keys)

        def length() -> int:
            return sum(cell_len(k) + (1 + cell_len(d) if lab else 0) for (k, d, _, _), lab in zip(keys, labelled)) \
                + max(0, len(keys) - 1)

        i = len(keys) - 1
        while width > 0 and length() > width and i >= 0:
            labelled[i] = False
            i -= 1
        return labelled

    def redraw(self) -> None:
        keys = self.keys()
        width = self.content_region.width if self.is_attached else 0
        if (keys, width) == self._keys:
            return
        self._keys = (keys, width)
        text = Text(no_wrap=True, overflow="ellipsis")
        key_style = component_style(self, "keys-bar--key")
        off_style = component_style(self, "keys-bar--off")
        for i, ((key, desc, name, enabled), labelled) in enumerate(zip(keys, self.fit(keys, width))):
            if i:
                text.append(" ")
            click = {"@click": f"app.simulate_key({name!r})"} if enabled else {}
            start = len(text)
            text.append(key, key_style if enabled else off_style)
            if labelled:
                text.append(f" {desc}", None if enabled else off_style)
            if click:
                text.apply_meta(click, start, len(text))
        self.update(text)
