"""README.md and docs/*.md hold: every relative link and image resolves (a ``#anchor`` to a heading of
the page it names), and every ``vtop ...`` command line they show parses with vtop's own parsers.

A command line is a line of a fenced ``bash``/``sh``/``console`` block, or an inline code span, that starts
with ``vtop`` (or ``.venv/bin/vtop``, ``python -m vtop``); a synopsis (``[--window 2s]``, ``|``, ``...``) is
not a command line and is left out, nor is a command's bare name in a sentence (`vtop replay`).
Placeholders (``URL``, ``FILE``) are taken as the strings they are: argparse accepts them where a value goes.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^```(\w*)\s*$")
SPAN = re.compile(r"`([^`\n]+)`")
PREFIXES = (".venv/bin/vtop ", "python -m vtop ", "python3 -m vtop ", ".venv/bin/python -m vtop ", "vtop ")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    s = re.sub(r"[`*_]", "", heading.strip().lower())
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    out: set[str] = set()
    in_fence = False
    for line in page.read_text().splitlines():
        if FENCE.match(line.strip()):
            in_fence = not in_fence
            continue
        m = re.match(r"^#{1,6}\s+(.*)$", line)
        if m and not in_fence:
            out.add(slug(m.group(1)))
    return out


def prose(text: str) -> str:
    """The text outside fenced blocks (a link inside one is code, not a link)."""
    out, in_fence = [], False
    for line in text.splitlines():
        if FENCE.match(line.strip()):
            in_fence = not in_fence
            continue
        if not in_fence:
            out.append(line)
    return "\n".join(out)


def broken_links(page: Path) -> list[str]:
    bad = []
    for target in LINK.findall(prose(page.read_text())):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, frag = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            bad.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
        elif frag and dest.suffix == ".md" and frag not in anchors(dest):
            bad.append(f"{page.relative_to(ROOT)}: {target} (no heading #{frag} there)")
    return bad


def command_lines(page: Path) -> list[str]:
    """The ``vtop ...`` command lines shown in ``page`` (see the module doc)."""
    out: list[tuple[str, bool]] = []  # (text, from a fenced block)
    lang: str | None = None
    for line in page.read_text().splitlines():
        m = FENCE.match(line.strip())
        if m:
            lang = None if lang is not None else m.group(1)
            continue
        if lang is not None:
            if lang in ("bash", "sh", "console", "shell"):
                text = line.strip().removeprefix("$ ")
                text = text.split(" #", 1)[0].strip()
                for cmd in re.split(r"\s*(?:&&|\|\||;|\|)\s*", text):
                    out.append((cmd, True))
            continue
        out += [(span, False) for span in SPAN.findall(line)]
    cmds = []
    for c, in_block in out:
        c = c.strip()
        for p in PREFIXES:
            if c.startswith(p) or c == p.strip():
                rest = c[len(p):] if c.startswith(p) else ""
                if any(x in rest for x in ("[", "|", "...", "…", "<", ">")):
                    break  # a synopsis, not a command line
                if rest.strip() in ("replay", "demo", "doctor", "export", "web", "watch") and not in_block:
                    break  # a command's name in a sentence ("in a replay (`vtop replay`) ...")
                cmds.append("vtop " + rest)
                break
    return cmds


SUBS = ("replay", "demo", "doctor", "export", "web", "watch")
FLAG = re.compile(r"--(\[no-\])?([a-z][a-z0-9-]*)")


def synopsis_flags(page: Path) -> list[tuple[str, str]]:
    """(subcommand, flag) of every flag in a synopsis: the lines of a fenced block without a language
    that start with ``vtop`` and the indented lines under them (``--[no-]x`` gives both)."""
    out: list[tuple[str, str]] = []
    lang: str | None = None
    sub: str | None = None
    for line in page.read_text().splitlines():
        m = FENCE.match(line.strip())
        if m:
            lang = None if lang is not None else m.group(1)
            sub = None
            continue
        if lang != "":
            continue
        if re.match(r"vtop(\s|$)", line):  # not "vtop.ui (Textual)" of a diagram
            words = line.split()
            sub = words[1] if len(words) > 1 and words[1] in SUBS else ""
        elif not line.startswith(" "):
            sub = None
        if sub is None:
            continue
        for neg, name in FLAG.findall(line):
            out.append((sub, f"--{name}"))
            if neg:
                out.append((sub, f"--no-{name}"))
    return out


def known_flag(sub: str, flag: str) -> bool:
    """Whether vtop's parser for ``sub`` ('' for the screen) takes ``flag`` (parsing it alone: an unknown
    flag comes back unparsed; a known one that wants a value ends in a usage error)."""
    from vtop import cli

    if sub in ("replay", "demo"):
        p = cli.replay_parser(f"vtop {sub}")
    elif sub == "doctor":
        p = cli.doctor_parser()
    elif sub == "export":
        from vtop.faces.exporter import parser as export_parser

        p = export_parser()
    elif sub == "web":
        from vtop.faces.web import parser as web_parser

        p = web_parser()
    elif sub == "watch":
        from vtop.faces.watch import parser as watch_parser

        p = watch_parser()
    else:
        p = cli.parser()
    try:
        _, rest = p.parse_known_args([flag])
    except SystemExit:
        return True
    return flag not in rest or (sub == "web" and known_flag("", flag))


def parse(cmd: str) -> None:
    """Parse ``cmd`` (``vtop ARGS``) as vtop would, without running it; raises SystemExit on bad usage."""
    from vtop import cli

    argv = shlex.split(cmd)[1:]
    if argv and argv[0] in ("replay", "demo"):
        cli.replay_parser(f"vtop {argv[0]}").parse_args(argv[1:])
    elif argv and argv[0] == "doctor":
        cli.doctor_parser().parse_args(argv[1:])
    elif argv and argv[0] == "export":
        from vtop.faces.exporter import parser as export_parser

        export_parser().parse_args(argv[1:])
    elif argv and argv[0] == "watch":
        from vtop.faces.watch import parser as watch_parser

        watch_parser().parse_args(argv[1:])
    elif argv and argv[0] == "web":
        from vtop.faces.web import parser as web_parser

        _, rest = web_parser().parse_known_args(argv[1:])
        cli.parser().parse_args(rest)
    else:
        cli.parser().parse_args(argv)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_image_resolves(page: Path) -> None:
    assert broken_links(page) == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_vtop_command_line_shown_parses(page: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = []
    for cmd in command_lines(page):
        try:
            parse(cmd)
        except SystemExit as e:
            if e.code not in (0, None):
                bad.append(f"{cmd!r}: {capsys.readouterr().err.strip().splitlines()[-1:]}")
    assert bad == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_flag_of_a_synopsis_is_vtops(page: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = [f"vtop {sub} {flag}".replace("  ", " ") for sub, flag in synopsis_flags(page) if not known_flag(sub, flag)]
    capsys.readouterr()
    assert bad == []


def test_the_readme_is_short_and_links_the_topic_pages() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) < 200
    for page in ("usage", "rules", "exit-codes", "exporter", "fleet", "reliability", "bench", "corpus", "h200"):
        assert f"(docs/{page}.md)" in text, page


def test_a_broken_link_and_an_unknown_flag_are_caught(tmp_path: Path) -> None:
    # the checks themselves: a page with a missing file, a missing anchor and a flag vtop does not have
    page = tmp_path / "page.md"
    (tmp_path / "there.md").write_text("# A heading\n")
    page.write_text("[ok](there.md#a-heading) [gone](nowhere.md) [anchor](there.md#nope) ![img](pic.svg)\n\n"
                    "Run `vtop --once --json`, then `vtop --no-such-flag`.\n")
    global ROOT
    root, ROOT = ROOT, tmp_path
    try:
        assert broken_links(page) == ["page.md: nowhere.md (no such file)",
                                      "page.md: there.md#nope (no heading #nope there)",
                                      "page.md: pic.svg (no such file)"]
    finally:
        ROOT = root
    cmds = command_lines(page)
    assert cmds == ["vtop --once --json", "vtop --no-such-flag"]
    parse(cmds[0])
    with pytest.raises(SystemExit):
        parse(cmds[1])
    page.write_text("```\nvtop [URL ...] [--interval 1] [--[no-]redact-prompts]\n"
                    "               [--no-such-flag]\nvtop doctor [--window 15s] [--interval 2]\n```\n")
    flags = synopsis_flags(page)
    assert flags == [("", "--interval"), ("", "--redact-prompts"), ("", "--no-redact-prompts"),
                     ("", "--no-such-flag"), ("doctor", "--window"), ("doctor", "--interval")]
    assert [f for sub, f in flags if not known_flag(sub, f)] == ["--no-such-flag"]
    assert not known_flag("doctor", "--once")  # the screen's flag, not doctor's
