"""Data collection (NVML, psutil, /metrics, log tail). Never imports Textual."""
