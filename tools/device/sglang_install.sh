#!/usr/bin/env bash
# sglang_install.sh [PART ...]
#
# Runs on the GPU machine, from the carried folder: bash .sglang-gpu/device/sglang_install.sh .sglang-gpu/part00
# Each call copies the parts it names into /tmp/sglparts (a carried path is there only for the call that
# carries it) and says which parts are still missing (exit 0). Once every part of MANIFEST is there it joins them,
# checks the bundle's sha256, installs into /tmp/sglsite (made fresh):
#   * the wheels of whl/ whose package this Python lacks, or has in an older version (pip --no-deps
#     --target); never the image's torch, triton, numpy, safetensors, huggingface-hub; always transformers
#     5.12.1 and tokenizers 0.22.2 (sglang 0.5.17's pin: its server does not import with the image's 5.17.0);
#   * sgl-kernel-site.tar.xz unpacked as is (sglang-kernel 0.4.5 without FlashAttention 3, SM100, InfLLM,
#     FlashMLA);
# and checks `import sglang` and the server's import chain. Exit 0 only when both imports work.
# Use it afterwards with: PYTHONPATH=/tmp/sglsite python3 -m sglang.launch_server ... --attention-backend triton
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PY=${PYTHON:-/opt/torch/.venv/bin/python3}
[ -x "$PY" ] || PY=python3
PARTS=/tmp/sglparts
SITE=/tmp/sglsite
say() { printf '[sglang_install +%ss] %s\n' "$SECONDS" "$*"; }
mkdir -p "$PARTS"
cp "$HERE/MANIFEST" "$PARTS/MANIFEST"
for p in "$@"; do cp "$p" "$PARTS/$(basename "$p")"; say "received $(basename "$p") ($(stat -c %s "$p") bytes)"; done
missing=0; total=0
while read -r kind name size sha; do
  [ "$kind" = part ] || continue
  total=$((total + 1))
  if [ ! -f "$PARTS/$name" ] || [ "$(stat -c %s "$PARTS/$name")" != "$size" ]; then
    missing=$((missing + 1)); echo "  $name: missing (carry it in a call: sglang_install.sh .sglang-gpu/$name)"
  fi
done < "$PARTS/MANIFEST"
say "$((total - missing)) of $total parts here; machine up $(cut -d' ' -f1 /proc/uptime) s"
# (a fresh machine has an empty /tmp: "machine up" far below the seconds since the first call means start over)
[ "$missing" = 0 ] || exit 0

want=$(awk '$1=="bundle_sha256"{print $2}' "$PARTS/MANIFEST")
got=$(cat "$PARTS"/part[0-9][0-9] | sha256sum | cut -d' ' -f1)
[ "$want" = "$got" ] || { echo "BUNDLE CHECKSUM MISMATCH: $got, MANIFEST says $want"; exit 11; }
rm -rf /tmp/sglbundle "$SITE"; mkdir -p /tmp/sglbundle "$SITE"
cat "$PARTS"/part[0-9][0-9] | tar -xf - -C /tmp/sglbundle
say "bundle checked and unpacked"

# Judged as SGLang's interpreter will see it, with no PYTHONPATH: the caller's (h200_sglang.sh puts vtop's
# /tmp/vtop-site first, which has sniffio) made this skip sniffio on the first GPU run (session 26), and the
# server's import then failed: "No module named 'sniffio'" (SGLang runs with PYTHONPATH=/tmp/sglsite only)
SEL=$(env -u PYTHONPATH "$PY" - /tmp/sglbundle/whl <<'PYEOF'
import glob, os, re, sys, importlib.metadata as md
try:
    from packaging.version import Version
except ImportError:  # the image has packaging; without it, a package already here is kept as it is
    Version = None
PROTECT = {"torch", "triton", "numpy", "safetensors", "huggingface-hub"}
# sglang 0.5.17 pins transformers==5.12.1: with the image's 5.17.0 its server does not import
# (AutoConfig.register("qwen3_asr") raises, 5.17 has that name); 5.12.1 wants tokenizers <= 0.23.0.
# Installed into /tmp/sglsite whatever the image has (they shadow the image's for SGLang only).
PIN = {"transformers", "tokenizers"}
for w in sorted(glob.glob(os.path.join(sys.argv[1], "*.whl"))):
    name, ver = os.path.basename(w).split("-")[:2]
    norm = re.sub(r"[-_.]+", "-", name).lower()
    if norm in PROTECT:
        continue
    if norm in PIN:
        print(w)
        continue
    try:
        have = md.version(norm)
    except md.PackageNotFoundError:
        have = None
    if have is None or (Version is not None and Version(have) < Version(ver)):
        print(w)
    else:
        print(f"# skip {norm} {ver} (here {have})", file=sys.stderr)
PYEOF
)
n=$(printf '%s\n' "$SEL" | grep -c . || true)
say "pip install --no-deps --target $SITE: $n wheels"
# shellcheck disable=SC2086
"$PY" -m pip install -q --no-deps --no-index --no-compile --target "$SITE" $SEL 2>&1 | grep -v '^WARNING: Target directory' || true
tar -xJf /tmp/sglbundle/sgl-kernel-site.tar.xz -C "$SITE"
say "installed: $(du -sm "$SITE" | cut -f1) MiB in $SITE"

export PYTHONPATH=$SITE
"$PY" -c "import sglang, importlib.metadata as m; print('import sglang OK', m.version('sglang'))"
say "import sglang done"
# The server's own import chain (what launch_server loads before any model); a ModuleNotFoundError here
# names a wheel that sglang_prepare.sh's SKIP list should keep.
"$PY" -W ignore -c "import sglang.launch_server, sglang.srt.entrypoints.http_server, sglang.srt.managers.scheduler, \
sglang.srt.model_executor.model_runner, sglang.srt.models.llama, sglang.srt.layers.attention.triton_backend; \
print('server imports OK')"
say "server imports done"
# sgl_kernel loads its sm90/ build by the GPU's compute capability: on a machine without a GPU this fails
# ("Could not load any common_ops library", it looks in sm100/, left out of the bundle)
"$PY" -W ignore -c "import sgl_kernel, torch; print('sgl_kernel OK on', torch.cuda.get_device_name(0))"
say "done"
