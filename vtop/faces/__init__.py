"""The faces other than the Textual screen (``vtop.ui``): each reads the one monitor
(``vtop.monitor``) and shows it its own way. ``headless`` (``--once``, ``doctor``,
``replay --doctor``), ``headless_fleet`` (``fleet --once``), ``exporter`` (``vtop export``:
Prometheus), ``export_csv`` (``replay --csv``), ``web`` (``vtop web``: the screen in a browser)
and ``demo`` (the shipped recording ``vtop demo`` plays)."""
