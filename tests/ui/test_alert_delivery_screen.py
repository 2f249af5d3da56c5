"""The screen delivers too (issue #41): with ``--webhook``, each start and clear of an incident goes to a
real local receiver off the tick, and a receiver that fails is said once, as a notice."""

from __future__ import annotations

from dataclasses import replace

from tests.helpers.pilot import wait_for
from tests.helpers.webhook_receiver import Receiver
from vtop.actions.alerts_out import Policy
from vtop.config import Config
from vtop.core.rules.alert import Alert
from vtop.ui.app import VtopApp


async def test_the_screen_posts_each_change_and_says_a_failing_receiver_once() -> None:
    with Receiver("ok") as good, Receiver("500") as bad:
        cfg = Config(urls=("http://127.0.0.1:9",), no_gpu=True,
                     webhook=(f"{good.url}/hook", f"{bad.url}/hook/s3cr3t-path"))
        app = VtopApp(cfg, autopoll=False, hostname="t")
        assert app.delivery is not None
        for s in app.delivery.senders:
            s.policy = Policy(attempts=1)
        stall = Alert("engine_stall", "critical", "Engine stall on :9", target="http://127.0.0.1:9",
                      since=app.monitor.clock.monotonic())
        async with app.run_test(size=(100, 30), notifications=True) as pilot:
            app.monitor.diagnoser.thresholds = replace(app.monitor.diagnoser.thresholds, alert_clear_hold_s=0.0)
            app._tick()  # the round the mount asked for (the rules run on what came: nothing)
            app.monitor.alerts = [stall]  # as the rules would say it; the next ticks run no rules (nothing new)
            app._tick()
            await wait_for(pilot, lambda: good.events() == [("start", "engine_stall")])
            app.monitor.alerts = []
            app._tick()
            await wait_for(pilot, lambda: good.events() == [("start", "engine_stall"), ("clear", "engine_stall")])
            await wait_for(pilot, lambda: bad.requests >= 2 and app.delivery.senders[1].pending() == 0)
            for _ in range(3):
                app._tick()
            said = [n.message for n in app._notifications if "alert delivery" in n.message]
            assert said == [f"alert delivery to json webhook {bad.url}/*** failed: HTTP 500: internal error at "
                            "/*** (later failures are not repeated)"]


def test_no_alert_delivery_turns_the_screens_delivery_off_whatever_the_config_says() -> None:
    """``--no-alert-delivery`` (what vtop web gives every tab; a screen beside a ``vtop watch`` service that
    reads the same config file): no delivery is made, even with a webhook and a command set."""
    from vtop.cli import parser
    from vtop.config import build

    ns = vars(parser().parse_args(["--no-alert-delivery", "--webhook", "https://ntfy.sh/t0pic",
                                   "--on-alert", "true", "--no-gpu", "http://127.0.0.1:9"]))
    ns.pop("config_file", None)
    cfg = build(ns, env={"XDG_CONFIG_HOME": "/nonexistent"})
    assert cfg.alert_delivery is False and cfg.webhook and cfg.on_alert
    assert VtopApp(cfg, autopoll=False, hostname="t").delivery is None
    on = replace(cfg, alert_delivery=True)
    app = VtopApp(on, autopoll=False, hostname="t")
    assert app.delivery is not None
    app.delivery.close()
