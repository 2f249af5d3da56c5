"""The fleet screen (``vtop --prometheus URL``) over answers recorded from a real Prometheus 2.42:
rows, alerts worst first, sort, ``/`` filter, Enter into one instance (the same server card and
GPU cards, from history), and a failing Prometheus said in words, with stale rows."""

from __future__ import annotations

from tests.helpers.prom_replay import PromReplay, clock_at, load
from vtop.config import Config
from vtop.monitor.fleet import Fleet
from vtop.sources.prometheus import PromClient
from vtop.ui.fleet_app import FleetApp
from vtop.ui.widgets.alerts_panel import AlertsPanel
from vtop.ui.widgets.fleet_drill import FleetDrill
from vtop.ui.widgets.fleet_table import FleetTable, fit_columns
from vtop.ui.widgets.server_panel import ServerCard

REC = load()


def _app(pr: PromReplay) -> FleetApp:
    cfg = Config()
    return FleetApp(cfg, fleet=Fleet(cfg, PromClient(pr.url), clock=clock_at(REC)), autorefresh=False)


async def test_table_alerts_sort_filter_and_drill_in() -> None:
    with PromReplay() as pr:
        app = _app(pr)
        async with app.run_test(size=(160, 50)) as pilot:
            await app.first()
            await pilot.pause()
            rows = app.fleet_rows_text()
            assert len(rows) == 7
            # worst first: the four criticals, then the runaway's warning, then gpu-e (starting, no alert) and the
            # busy SGLang server (no alert)
            assert rows[4].startswith("▲ UP gpu-a:8000 vLLM") and "Runaway decode" in rows[4]
            assert "ssh gpu-a vtop" in rows[4]
            assert rows[5].startswith(" STARTING gpu-e:8000") and "vtop on the box: starting: CUDA graph capture" in rows[5]
            assert rows[6].startswith(" UP gpu-f:30000 SGLang tiny")
            assert any(r.startswith("✖ DOWN gpu-c:8000") for r in rows)
            assert any(r.startswith("✖ UP gpu-g:30000 SGLang") and "Engine stalled" in r for r in rows)
            panel = app.query_one("#alerts", AlertsPanel)
            assert [a.severity for a in panel.alerts] == ["critical", "critical", "critical", "critical", "warning"]
            table = app.query_one(FleetTable)
            # sort by a column: o steps to the next one (the state), again to the instance
            await pilot.press("o", "o")
            assert table.sort_key == "instance"
            assert [r.instance for r in table.rows] == ["gpu-a:8000", "gpu-b:8000", "gpu-c:8000", "gpu-d:8000",
                                                        "gpu-e:8000", "gpu-f:30000", "gpu-g:30000"]
            await pilot.press("r")
            assert [r.instance for r in table.rows][0] == "gpu-g:30000"
            # / filters (k9s habits), Esc clears
            await pilot.press("slash", *"runaway")
            assert [r.instance for r in table.rows] == ["gpu-a:8000"]
            await pilot.press("enter")
            assert table.has_focus
            # Enter opens the instance: the same server card and the host's 8 GPU cards, full sparklines
            await pilot.press("enter")
            await pilot.pause()
            for _ in range(20):
                if isinstance(app.screen, FleetDrill) and app.screen.drill is not None:
                    break
                await pilot.pause(0.1)
            scr = app.screen
            assert isinstance(scr, FleetDrill) and scr.key == "vllm/gpu-a:8000"
            card = scr.query_one(ServerCard)
            assert card.view is not None and card.view.state == "up"
            assert len(card.view.series["gen_tps"]) >= 20
            assert sorted(scr.history.tracks) == list(range(8))
            assert "ssh gpu-a vtop" in str(scr.query_one("#drill-box").render())
            await pilot.press("escape")
            assert not isinstance(app.screen, FleetDrill)
            await pilot.press("escape")
            assert len(table.rows) == 7


async def test_a_failing_prometheus_shows_its_error_and_stale_rows_not_a_frozen_screen() -> None:
    with PromReplay() as pr:
        app = _app(pr)
        async with app.run_test(size=(120, 30)) as pilot:
            await app.first()
            pr.mode = "down"
            for _ in range(4):
                app.fleet.clock.base.advance(5.0)  # type: ignore[attr-defined]
                await app.refresh_once()
            await pilot.pause()
            status = str(app.query_one("#status").render())
            assert "PROMETHEUS FAILING" in status and "TSDB not ready" in status
            assert "data 20s old" in status  # late: its age is said
            assert app.query_one("#status").has_class("-error")
            rows = app.fleet_rows_text()
            assert any("STALE gpu-a:8000" in r for r in rows)
            # and it comes back
            pr.mode = "ok"
            await app.refresh_once()
            await pilot.pause()
            assert "PROMETHEUS FAILING" not in str(app.query_one("#status").render())


async def test_the_status_line_does_not_tick_while_all_is_well() -> None:
    """Between refreshes nothing on the status line changes (the data's age is said only once it is
    late): no redraw every second for nothing. Fails on the old code ("data 1s old", "data 2s old")."""
    with PromReplay() as pr:
        app = _app(pr)
        async with app.run_test(size=(120, 30)) as pilot:
            await app.first()
            app.update_status()
            await pilot.pause()
            before = str(app.query_one("#status").render())
            for _ in range(4):
                app.fleet.clock.base.advance(1.0)  # type: ignore[attr-defined]
                app.update_status()
            await pilot.pause()
            assert str(app.query_one("#status").render()) == before and " old" not in before


def test_narrow_tables_keep_state_instance_and_alert() -> None:
    keys = [c.key for c in fit_columns(80)]
    assert {"state", "instance", "alert", "running", "waiting", "kv"} <= set(keys)
    assert "finished" not in keys
    assert [c.key for c in fit_columns(200)][-1] == "alert" and len(fit_columns(200)) == 15
    assert "engine" in [c.key for c in fit_columns(200)] and "engine" not in keys  # the first to go


async def test_a_prometheus_down_at_start_is_read_back_with_its_history_when_it_returns() -> None:
    with PromReplay(mode="down") as pr:
        app = _app(pr)
        async with app.run_test(size=(120, 30)) as pilot:
            await app.first()
            assert app.fleet.error is not None and not app.fleet.rows
            pr.mode = "ok"
            await app.refresh_once()
            await pilot.pause()
            f = app.fleet
            assert f.error is None and f.backfilled
            # judged over the history read now: the runaway is named at once
            assert "runaway" in {a.rule for a in f.rows["vllm/gpu-a:8000"].alerts}
