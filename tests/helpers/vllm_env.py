"""What every start of the real vLLM CPU build in the tests gets in its environment, beyond each start's own
settings (tests/real/conftest.py, the container tests, tests/helpers/dockerd.py; the shell scripts
tests/real/vllm_cpu/recipe.sh and tools/device/cpu_serve.sh set the same)."""

from __future__ import annotations

#: vLLM 0.32.0's CPU build never loads its torch.compile AOT cache: every start logs "Compiling model again due to
#: a load failure from .../torch_aot_compile/..., reason: 'function' object has no attribute 'finalize_loading'"
#: and compiles afresh. With ``VLLM_USE_AOT_COMPILE=0`` it takes the older compile path, whose cache does load.
#: Measured on the 2-core dev box (2026-12-06, warm caches, seconds from the launch to /health): 36.8 and 38.4
#: with AOT, 31.7 without (warm-up and compile 4 s instead of 8); the real tier starts vLLM about 20 times. The
#: start still logs "Warming up model for the compilation..." and "Warming up done." around the compile, which
#: is what vtop's torch.compile phase follows (vtop/core/phases/patterns.py knows both paths' lines).
SERVER_ENV = {"VLLM_USE_AOT_COMPILE": "0"}
