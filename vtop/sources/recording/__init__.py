"""Recordings, written and read: ``record`` (vtop's own ``--record`` file: the
:class:`~vtop.sources.recording.record.Recorder` that writes it, ``read``/``load`` that read it
back, the replayed GPU source) and ``trace`` (a raw trace of the corpus, ``tests/corpus/FORMAT.md``,
read into the same event stream).

Playing a recording is not here: :mod:`vtop.monitor.player` feeds these events into the
:class:`~vtop.monitor.monitor.Monitor`, so it sits in the monitor's layer. One package for both
would span two layers and make a circle (the monitor writes recordings through ``Recorder``;
the player drives the monitor), which the layer contracts in pyproject.toml forbid."""
