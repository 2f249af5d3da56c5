"""The corpus' tools: the recorder of real incidents (``record``), the trace shrinker (``shrink``) and
the live-versus-replay check (``live_vs_replay``). The traces themselves and the scoreboard that plays
them stay in ``tests/corpus/``."""
