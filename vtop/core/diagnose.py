"""Compatibility: the diagnosis rules live in :mod:`vtop.core.rules` (one module per family).

This thin re-export stays so that code written against the old module (branches in flight,
scripts) keeps importing; everything in vtop, tests and bench imports :mod:`vtop.core.rules`.
"""

from __future__ import annotations

from vtop.core.rules import RULES, SEVERITIES, Alert, Diagnoser, Thresholds, diagnose_once

__all__ = ["RULES", "SEVERITIES", "Alert", "Diagnoser", "Thresholds", "diagnose_once"]
