"""vtop: a live terminal dashboard for GPU boxes that serve LLMs with vLLM.

Importing this package loads nothing heavy (no Textual, no NVML).
"""

__version__ = "0.1.0"
