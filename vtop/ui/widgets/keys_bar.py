"""The key hints on the bottom line: one line of text, drawn in the first frame.

Why not Textual's ``Footer``: it shows nothing until the screen has published
its bindings, then rebuilds itself (a widget per key) each time they are
published again; at start-up that happened three times after the first frame,
and the keys appeared a quarter of a second after the rest of the screen on
the 2-core box (``bench/run.py``'s first frame waits for them). Here the hints
are one ``Static`` made from the same active bindings: in the first frame,
redrawn only when the bindings change, and each key still clickable.

Shown as Textual's footer shows them: ``check_action`` False hides a key,
None dims it (read-only mode).
"""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.widgets import Static


class KeysBar(Static):
    COMPONENT_CLASSES = {"keys-bar--key", "keys-bar--off"}

    def __init__(self, **kw: Any) -> None:
        super().__init__("", markup=False, **kw)
        self._keys: list[tuple[str, str, str, bool]] | None = None

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
        return out

    def redraw(self) -> None:
        keys = self.keys()
        if keys == self._keys:
            return
        self._keys = keys
        text = Text(no_wrap=True, overflow="ellipsis")
        key_style = self.get_component_rich_style("keys-bar--key", partial=True)
        off_style = self.get_component_rich_style("keys-bar--off", partial=True)
        for i, (key, desc, name, enabled) in enumerate(keys):
            if i:
                text.append(" ")
            click = {"@click": f"app.simulate_key({name!r})"} if enabled else {}
            start = len(text)
            text.append(key, key_style if enabled else off_style)
            text.append(f" {desc}", None if enabled else off_style)
            if click:
                text.apply_meta(click, start, len(text))
        self.update(text)
