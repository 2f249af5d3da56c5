"""One look at the Hugging Face Hub's cache for one repo (a plain type: :mod:`vtop.sources.hfcache` makes it,
:mod:`vtop.core.download` reads it)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class CacheScan:
    """One look at the Hub's cache for one repo (:func:`vtop.sources.hfcache.scan_repo`)."""

    mono: float
    repo: str
    #: the cache folder read (``HF_HUB_CACHE``, or ``HF_HOME``/hub, or ``~/.cache/huggingface/hub``)
    cache_dir: str
    #: where the cache folder was read from: ``environ`` (the server's /proc/PID/environ) or ``default``
    cache_from: str
    #: the size of each ``blobs/*.incomplete`` file, by its name
    incomplete: dict[str, int] = field(default_factory=dict)
    #: bytes of the weight files already complete in the repo's snapshot(s)
    complete_bytes: int = 0
    #: the number of weight files complete
    complete_files: int = 0
    #: the tensors' bytes the repo's index names (None: no index in the cache)
    index_total: int | None = None
    #: the shards the index names
    index_files: int | None = None
    #: the repo's folder exists in the cache at all
    repo_seen: bool = False
    #: the scan stopped at its deadline (the numbers are partial)
    cut: bool = False
    error: str | None = None

    @property
    def done(self) -> int:
        return self.complete_bytes + sum(self.incomplete.values())
