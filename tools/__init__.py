"""vtop's tools that are not tests: they make what the tests read (the corpus' traces, the
fixtures, the screenshots) or run on the GPU machine. Run from the repository's root as
``python -m tools.NAME`` (``tools.corpus.record``, ``tools.make_screenshots``, ...)."""
