"""The top-level parts of a Python object's printed form, found without evaluating it. Pure.

SGLang's request log prints its request objects with its own repr (``_dataclass_to_string_truncated`` in
SGLang 0.5.17's ``python/sglang/srt/utils/request_logger.py``): a dataclass as ``Name(field=value, ...)``, a
dict as ``{'key': value, ...}``, a string as its ``repr()`` (cut to ``'head' ... 'tail'`` when longer than the
log level's limit), a list as ``str(list)`` (cut to ``[..] ... [..]``), anything else as ``str()``. These
helpers find where each top-level value starts and ends (strings skipped whole, brackets counted), so a
caller reads the few fields it wants, or blanks one, without reading the others: a 64 KiB prompt costs a
handful of regex steps. A text that ends inside a value (a line cut short) or holds what the grammar does not
(an unterminated quote) gives an end of -1: the caller treats everything from there on as unread.
"""

from __future__ import annotations

import re

__all__ = ["Entry", "entries", "items", "literal_str", "value_end"]

_STR = r"""'[^'\\\n]*(?:\\.[^'\\\n]*)*'|"[^"\\\n]*(?:\\.[^"\\\n]*)*\""""
# At the container's own level a comma ends a value; deeper, commas are skipped with the rest of a run.
_TOP_TOKEN = re.compile(_STR + r"""|[\[\](){}]|,|[^'"\[\](){},]+""")
_DEEP_TOKEN = re.compile(_STR + r"""|[\[\](){}]|[^'"\[\](){}]+""")
_FIELD_RE = re.compile(r"([A-Za-z_]\w*)=")
_KEY_RE = re.compile(r"(" + _STR + r"): ")

#: (name, value start, value end): ``end`` is -1 when the text ended inside the value
Entry = tuple[str, int, int]


def value_end(s: str, i: int, *, end_ok: bool = False) -> int:
    """Where the value starting at ``s[i]`` ends: the index of the ``,`` or the closing bracket after it at its
    own level, ``len(s)`` when ``end_ok`` and the text ends at that level, else -1."""
    depth = 0
    n = len(s)
    while i < n:
        m = (_TOP_TOKEN if depth == 0 else _DEEP_TOKEN).match(s, i)
        if m is None:
            return -1  # a quote that opens no complete literal
        c = s[i]
        if c in "([{":
            depth += 1
        elif c in ")]}":
            if depth == 0:
                return i
            depth -= 1
        elif c == "," and depth == 0:
            return i
        i = m.end()
    return n if end_ok and depth == 0 else -1


def entries(s: str, i: int, *, keyed: bool, end_ok: bool = False) -> tuple[list[Entry], int]:
    """The entries of a container whose body starts at ``s[i]`` (just after ``Name(`` or ``{``): ``name=value``
    fields, or with ``keyed`` ``'key': value`` pairs (the key without its quotes). Returns them and the index
    of the closing bracket (``len(s)`` with ``end_ok`` for a body that runs to the end of the text), or -1
    where the text ended or broke the grammar before it (the entries read so far come back; the last may
    have an end of -1)."""
    out: list[Entry] = []
    n = len(s)
    if i < n and s[i] in ")]}":
        return out, i
    if i >= n:
        return out, (n if end_ok else -1)
    rx = _KEY_RE if keyed else _FIELD_RE
    while True:
        m = rx.match(s, i)
        if m is None:
            return out, -1
        name = m.group(1)[1:-1] if keyed else m.group(1)
        end = value_end(s, m.end(), end_ok=end_ok)
        out.append((name, m.end(), end))
        if end < 0:
            return out, -1
        if end >= n or s[end] != ",":
            return out, end
        i = end + 2 if s.startswith(", ", end) else end + 1


def items(s: str, i: int) -> tuple[list[tuple[int, int]], int]:
    """The elements of a list or tuple whose body starts at ``s[i]`` (just after ``[`` or ``(``): their
    (start, end) spans and the index of the closing bracket, or -1 as :func:`entries`."""
    out: list[tuple[int, int]] = []
    n = len(s)
    if i < n and s[i] in ")]}":
        return out, i
    while i < n:
        end = value_end(s, i)
        out.append((i, end))
        if end < 0:
            return out, -1
        if s[end] != ",":
            return out, end
        i = end + 2 if s.startswith(", ", end) else end + 1
    return out, -1


_ESC = {"\\": "\\", "'": "'", '"': '"', "n": "\n", "t": "\t", "r": "\r"}


def literal_str(v: str) -> str | None:
    """The string a ``repr()`` literal stands for (the common escapes undone), or None for any other value."""
    if len(v) < 2 or v[0] not in "'\"" or v[-1] != v[0] or re.fullmatch(_STR, v) is None:
        return None
    body = v[1:-1]
    if "\\" not in body:
        return body
    return re.sub(r"\\(.)", lambda m: _ESC.get(m.group(1), "\\" + m.group(1)), body)
