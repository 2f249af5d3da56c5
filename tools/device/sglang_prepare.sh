#!/usr/bin/env bash
# sglang_prepare.sh [TARGET]
#
# Runs on the CPU machine (it needs PyPI), in the project's root:
#     bash tools/device/sglang_prepare.sh              # TARGET defaults to ./.sglang-gpu
# and builds what the GPU machine (no internet; CPython 3.12.3, torch 2.11.0+cu130, an H200) needs to run
# SGLang 0.5.17, the newest release whose wheel pins torch==2.11.0 (0.5.18 to 0.5.21 pin torch 2.13.0,
# 0.5.22 and 0.5.23 torch 2.14.1; tools/device/README-sglang.md has the table):
#     TARGET/part00, part01, ...  the bundle, split into equal parts of at most $PART_MIB MiB (default 40: the
#                                 project's own files, about 17 MiB, travel with every call, and a call carries
#                                 64 MiB in all)
#     TARGET/device/              sglang_install.sh, sglang_serve.sh, sglang_tiny.py and MANIFEST (sha256 of
#                                 the bundle and of each part)
#     TARGET/cache/               the downloads, reused by the next run
# The bundle: whl/ (the wheels the image lacks, less SKIP below), sgl-kernel-site.tar.xz (sglang-kernel
# 0.4.5 without the kernels a bf16 Llama on the H200 never loads) and device/.
# TARGET must be git-ignored, or every call to the GPU machine would carry it. In the main checkout:
#     echo /.sglang-gpu/ >> .git/info/exclude
# (this branch's .gitignore names it too).
# Idempotent and deterministic: cached files with the right sha256 are not fetched again; the tar is
# packed with sorted names, fixed owners and times, so a re-run gives the same sha256.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
TARGET=$(realpath -m "${1:-.sglang-gpu}")
PART_MIB=${PART_MIB:-40}
PY=${PYTHON:-python3}
LOCK=$HERE/sglang-wheels.lock
KERNEL_WHL=sglang_kernel-0.4.5-cp310-abi3-manylinux2014_x86_64.whl
CACHE=$TARGET/cache
say() { printf '[sglang_prepare %s] %s\n' "$(date +%H:%M:%S)" "$*"; }

P=$(dirname "$TARGET"); while [ ! -d "$P" ]; do P=$(dirname "$P"); done
if git -C "$P" rev-parse --is-inside-work-tree >/dev/null 2>&1 \
   && ! git -C "$P" check-ignore -q "$TARGET/part00"; then
  ROOT=$(git -C "$P" rev-parse --show-toplevel)
  echo "ERROR: $TARGET is inside a git checkout and not ignored. First run:"
  echo "    echo /${TARGET#"$ROOT"/}/ >> $(realpath -m "$P/$(git -C "$P" rev-parse --git-path info/exclude)")"
  exit 2
fi
mkdir -p "$CACHE/whl"

# ---- 1. Download the locked files (pinned by sha256; those already cached are kept).
REQ=$CACHE/requirements.txt
: > "$REQ"
while read -r sha size file; do
  case $sha in ''|'#'*) continue ;; esac
  if [ -f "$CACHE/whl/$file" ] && [ "$(sha256sum < "$CACHE/whl/$file" | cut -d' ' -f1)" = "$sha" ]; then continue; fi
  name=${file%%-*}; rest=${file#*-}; ver=${rest%%-*}
  echo "$name==$ver --hash=sha256:$sha" >> "$REQ"
done < "$LOCK"
if [ -s "$REQ" ]; then
  say "downloading $(wc -l < "$REQ") wheels into $CACHE/whl"
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_34_x86_64 --platform manylinux_2_31_x86_64 --platform manylinux_2_28_x86_64 \
    --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux_2_12_x86_64 --platform manylinux2010_x86_64 \
    --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 --platform any \
    -d "$CACHE/whl" -r "$REQ" 2>&1 | sed "/^WARNING: Location 'file:/d"
fi
while read -r sha size file; do
  case $sha in ''|'#'*) continue ;; esac
  [ "$(sha256sum < "$CACHE/whl/$file" | cut -d' ' -f1)" = "$sha" ] && [ "$(stat -c %s "$CACHE/whl/$file")" = "$size" ] \
    || { echo "ERROR: $file: sha256 or size differs from $(basename "$LOCK")"; exit 3; }
done < "$LOCK"

# ---- 2. The wheels left out (file name prefixes), each for a reason a tiny bf16 Llama on one H200
# served with --attention-backend triton does not need. Every import of them in sglang/srt 0.5.17 is
# inside a function or a backend module loaded only when chosen (grep of the wheel's source). If
# sglang_install.sh's import check names one of them, drop its line here and run this again.
SKIP=(
  tokenspeed_triton-       # 94.9 MB: a Triton fork for tokenspeed-mla (DeepSeek MLA), its only user
  tokenspeed_mla-          #   tokenspeed_mla_backend.py imports it inside the backend
  nvidia_cutlass_dsl_libs_cu12-  # 88.4 MB: the CUDA 12 build of the CuTe DSL runtime; the machine is CUDA 13
  nvidia_cutlass_dsl_libs_cu13-  # 88.0 MB: CuTe DSL runtime for flash-attn-4 / quack kernels (fa4, sm100)
  nvidia_nvvm-             # 75.1 MB: the image has cuda-toolkit 13.0.2 (nvcc 13.0 ran there, KINDS.md)
  nvidia_cuda_nvcc-        # 47.0 MB: idem
  nvidia_cuda_crt-         #   idem
  nvidia_cuda_nvdisasm-    #   idem
  nvidia_cuda_cccl-        #   idem
  tilelang-                # 50.1 MB: TileLang kernels (DeepSeek V3.2 sparse attention)
  z3_solver-               # 29.3 MB: a dependency of tilelang / helion's autotuning
  nvidia_mathdx-           # 23.0 MB: cuBLASDx/cuFFTDx headers for JIT kernels
  helion-                  # 1.6 MB: MoE Triton autotuning (helion_utils.py, MoE runner only)
)
SKIP_RE=$(printf '%s\n' "${SKIP[@]}" | sed 's/ .*//' | paste -sd'|')

# ---- 3. Strip sglang-kernel 0.4.5 (383.0 MB wheel, 1205.7 MB unpacked) into a tar.xz for /tmp/sglsite.
KSTRIP=(
  # 1122.6 MB unpacked (342.0 MB zipped): FlashAttention 3 for every head size and dtype. Imported only
  # by the fa3 attention backend (flashattention_backend.py, inside a method); the bundle serves with
  # --attention-backend triton.
  '^sgl_kernel/flash_ops\.abi3\.so$'
  # 19.5 MB: the SM100 (Blackwell) build of common_ops; load_utils.py loads sm90/ on an H200.
  '^sgl_kernel/sm100/'
  # 29.4 MB: InfLLM-V2 attention (MiniCPM4), loaded by infllm_v2/_loader.py on first use only.
  '^sgl_kernel/infllm_ops\.cpython-310-x86_64-linux-gnu\.so$'
  # 15.0 MB: FlashMLA (DeepSeek MLA), its import in flash_mla.py is guarded.
  '^sgl_kernel/flashmla_ops\.abi3\.so$'
)
KSITE=$CACHE/sgl-kernel-site.tar.xz
KEY=$(printf '%s\n' "$(grep " $KERNEL_WHL\$" "$LOCK")" "${KSTRIP[@]}" "pack-v1" | sha256sum | cut -d' ' -f1)
if [ -f "$KSITE" ] && [ "$(cat "$KSITE.key" 2>/dev/null)" = "$KEY" ]; then
  say "reusing $KSITE"
else
  say "stripping $KERNEL_WHL into $KSITE (xz -6)"
  "$PY" - "$CACHE/whl/$KERNEL_WHL" "$KSITE.tmp" "${KSTRIP[@]}" <<'PYEOF'
import calendar, re, sys, tarfile, zipfile
whl, out, rules = sys.argv[1], sys.argv[2], sys.argv[3:]
drop = re.compile("|".join(rules))
z = zipfile.ZipFile(whl)
members = sorted((i for i in z.infolist() if not i.is_dir()), key=lambda i: i.filename)
dir_mtime = max(calendar.timegm(i.date_time + (0, 0, 0)) for i in members)
dirs, kept, kept_b, gone, gone_b = set(), 0, 0, 0, 0
def info(name, mtime):
    ti = tarfile.TarInfo(name); ti.mtime = mtime; ti.uid = ti.gid = 0; ti.uname = ti.gname = "root"
    return ti
with tarfile.open(out, "w:xz", preset=6, format=tarfile.GNU_FORMAT) as t:
    for i in members:
        if drop.search(i.filename):
            gone += 1; gone_b += i.file_size; continue
        parts = i.filename.split("/")[:-1]
        for k in range(1, len(parts) + 1):
            d = "/".join(parts[:k])
            if d not in dirs:
                dirs.add(d); ti = info(d, dir_mtime); ti.type = tarfile.DIRTYPE; ti.mode = 0o755; t.addfile(ti)
        ti = info(i.filename, calendar.timegm(i.date_time + (0, 0, 0)))
        ti.size = i.file_size
        ti.mode = ((i.external_attr >> 16) & 0o777) or 0o644
        with z.open(i) as f:
            t.addfile(ti, f)
        kept += 1; kept_b += i.file_size
print(f"  kept {kept} files ({kept_b / 1e6:.1f} MB unpacked), removed {gone} files ({gone_b / 1e6:.1f} MB)")
PYEOF
  mv "$KSITE.tmp" "$KSITE"; echo "$KEY" > "$KSITE.key"
fi

# ---- 4. Pack (deterministic) and split.
STAGE=$CACHE/stage
rm -rf "$STAGE"; mkdir -p "$STAGE/whl" "$STAGE/device"
kept=0; kept_b=0; skipped_b=0
while read -r sha size file; do
  case $sha in ''|'#'*) continue ;; esac
  [ "$file" = "$KERNEL_WHL" ] && continue
  if [[ $file =~ ^($SKIP_RE) ]]; then skipped_b=$((skipped_b + size)); continue; fi
  ln -f "$CACHE/whl/$file" "$STAGE/whl/$file" 2>/dev/null || cp "$CACHE/whl/$file" "$STAGE/whl/"
  kept=$((kept + 1)); kept_b=$((kept_b + size))
done < "$LOCK"
ln -f "$KSITE" "$STAGE/sgl-kernel-site.tar.xz" 2>/dev/null || cp "$KSITE" "$STAGE/sgl-kernel-site.tar.xz"
cp "$HERE/sglang_install.sh" "$HERE/sglang_serve.sh" "$HERE/sglang_tiny.py" "$STAGE/device/"
BUNDLE=$CACHE/bundle.tar
tar --sort=name --format=gnu --owner=0 --group=0 --numeric-owner --mtime=@0 --mode=u+rw,go+r,go-w \
    --hard-dereference -cf "$BUNDLE" -C "$STAGE" device sgl-kernel-site.tar.xz whl
SIZE=$(stat -c %s "$BUNDLE"); SHA=$(sha256sum < "$BUNDLE" | cut -d' ' -f1)
MAX=$((PART_MIB * 1024 * 1024)); N=$(( (SIZE + MAX - 1) / MAX )); CHUNK=$(( (SIZE + N - 1) / N ))
rm -f "$TARGET"/part[0-9][0-9]
split -b "$CHUNK" -d -a 2 "$BUNDLE" "$TARGET/part"
rm -rf "$STAGE" "$BUNDLE"

rm -rf "$TARGET/device"; mkdir -p "$TARGET/device"
cp "$HERE/sglang_install.sh" "$HERE/sglang_serve.sh" "$HERE/sglang_tiny.py" "$TARGET/device/"
{
  echo "# written by sglang_prepare.sh $(date -u +%Y-%m-%dT%H:%M:%SZ): sglang 0.5.17 bundle for the GPU machine"
  echo "bundle_sha256 $SHA"
  echo "bundle_bytes $SIZE"
  for p in "$TARGET"/part[0-9][0-9]; do echo "part $(basename "$p") $(stat -c %s "$p") $(sha256sum < "$p" | cut -d' ' -f1)"; done
} > "$TARGET/device/MANIFEST"

echo
echo "wheels kept: $kept ($kept_b bytes); left out by SKIP: $skipped_b bytes; sgl-kernel-site.tar.xz: $(stat -c %s "$KSITE") bytes"
echo "bundle: $SIZE bytes, sha256 $SHA"
echo "parts ($N, at most $PART_MIB MiB each):"
awk '$1=="part"{printf "  %s  %d bytes (%.1f MiB)\n", $2, $3, $3/1048576}' "$TARGET/device/MANIFEST"
