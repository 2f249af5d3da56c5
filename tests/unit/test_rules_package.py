"""The rules package's own contract: every rule id has one family that raises it, and the corpus
traces a rule's docstring names exist."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

from vtop.core.rules import RULES, Diagnoser
from vtop.core.rules.diagnoser import default_rules

TRACES = Path(__file__).resolve().parents[1] / "corpus" / "traces"
FAMILIES = ("runaway", "stall", "death", "kv", "oom", "startup", "gpu", "flags")


def test_every_rule_id_is_raised_by_exactly_one_family() -> None:
    ids = [i for r in default_rules() for i in r.ids]
    assert sorted(ids) == sorted(RULES)
    # a fresh set per diagnoser: the OOM rule keeps state of its own
    a, b = Diagnoser(), Diagnoser()
    assert not any(x is y for x, y in zip(a.rules, b.rules))


def test_each_family_docstring_names_its_evidence_and_only_real_traces() -> None:
    names = {p.name for p in TRACES.iterdir() if p.is_dir()}
    for fam in FAMILIES:
        doc = importlib.import_module(f"vtop.core.rules.{fam}").__doc__ or ""
        assert "Evidence" in doc or "evidence" in doc, fam
        assert "Corpus trace" in doc, fam
        named = set(re.findall(r"\b((?:h200-)?(?:runaway|engine|kv|normal|startup|clean|restart)-[a-z0-9-]+[a-z0-9])\b", doc))
        assert named <= names, (fam, named - names)
