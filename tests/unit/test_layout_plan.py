"""The layout plan (vtop/ui/layout.py): parts rise level by level in the order given while rows are left."""

from __future__ import annotations

from vtop.ui.layout import Part, plan


def test_steps_that_fit_are_taken_in_order_and_a_big_one_is_skipped_for_smaller_ones() -> None:
    parts = [Part("alerts", (0, 3, 7, 9)), Part("gpu", (0, 1, 6)), Part("srv", (0, 1, 4, 10)), Part("log", (0, 4))]
    order = [("alerts", 1), ("gpu", 1), ("srv", 1), ("srv", 2), ("alerts", 2), ("srv", 3), ("gpu", 2), ("log", 1)]
    # 22 rows (80x24 less the status line and the keys): alerts 7 + gpu 1 + srv 10 = 18; the GPU
    # card (5 more) does not fit, the log's 4 rows do
    assert plan(22, parts, order) == {"alerts": 2, "gpu": 1, "srv": 3, "log": 1}
    # 10 rows: the alert's title, one line per card, the queue rows; the fix (4 more) does not fit
    assert plan(10, parts, order) == {"alerts": 1, "gpu": 1, "srv": 2, "log": 0}
    # 4 rows: the title and one GPU line; the server's line does not fit
    assert plan(4, parts, order) == {"alerts": 1, "gpu": 1, "srv": 0, "log": 0}


def test_a_step_never_lowers_a_part_and_unknown_parts_are_ignored() -> None:
    parts = [Part("a", (0, 2, 5))]
    assert plan(10, parts, [("a", 2), ("a", 1), ("nope", 1), ("a", 7)]) == {"a": 2}
