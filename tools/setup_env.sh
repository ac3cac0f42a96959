#!/usr/bin/env bash
# Create (or reuse) the project's virtual environment in .venv/ and install
# the pinned stack: torch 2.13.0 (CPU), mmengine 0.10.7, mmcv 2.1.0 built
# from source with its ops, mmdet 3.3.0, openmim, and mmcalidet itself
# (editable, with its Cython extension).
#
# Idempotent: every step is skipped when what it makes is already there.
# The mmcv wheel (a ~15 minute build on 2 cores) is kept outside the clone,
# in $MMCALIDET_CACHE (default ~/.cache/mmcalidet/wheels), so fresh clones
# reuse it.
#
# GPU: when a CUDA toolkit (nvcc) and a CUDA build of torch are present
# (install torch==2.13.0 from a CUDA index into the venv first, see
# docs/get_started.md), mmcv is built with its CUDA ops (FORCE_CUDA=1) and
# cached apart from the CPU wheel (torch-<version>-cu<XY>-<python>).
# MMCALIDET_CPU_ONLY=1 forces the CPU build.
#
# Sourced (`source tools/setup_env.sh`), the script only defines its
# functions (find_nvcc, mmcv_cuda_tag, mmcv_wheel_dir, log, logged, and the
# readiness checks have, importable, mmcv_has_ops, which use $PY) and
# installs nothing.

# find_nvcc: the nvcc of $CUDA_HOME, the PATH or /usr/local/cuda; nothing
# when there is none.
find_nvcc() {
    if [ -n "${CUDA_HOME:-}" ] && [ -x "$CUDA_HOME/bin/nvcc" ]; then
        echo "$CUDA_HOME/bin/nvcc"
    elif command -v nvcc >/dev/null 2>&1; then
        command -v nvcc
    elif [ -x /usr/local/cuda/bin/nvcc ]; then
        echo /usr/local/cuda/bin/nvcc
    fi
    return 0
}

# mmcv_cuda_tag PY: "cu<XY>" (torch's CUDA version, e.g. cu126) when mmcv is
# to be built with CUDA ops: nvcc exists and PY's torch is a CUDA build (no
# GPU is needed to build); nothing for a CPU build.
mmcv_cuda_tag() {
    local cuda
    if [ "${MMCALIDET_CPU_ONLY:-0}" = 1 ] || [ -z "$(find_nvcc)" ]; then
        return 0
    fi
    cuda="$("$1" -c 'import torch; print(torch.version.cuda or "")' \
        2>/dev/null || true)"
    if [ -n "$cuda" ]; then
        echo "cu${cuda//./}"
    fi
    return 0
}

# mmcv_wheel_dir CACHE TORCH_VERSION PYTAG CUDA_TAG: the wheel cache folder;
# a CUDA build has its own (CUDA_TAG in the name), the CPU one is unchanged.
mmcv_wheel_dir() {
    if [ -n "${4:-}" ]; then
        echo "$1/torch-$2-$4-$3"
    else
        echo "$1/torch-$2-$3"
    fi
}

log() { echo "[setup_env] $*" >&2; }

# logged CMD...: run CMD with its output appended to $SETUP_LOG (pip's and
# the builds' output stays off the console); on failure, say so with the
# log's end and return 1.
logged() {
    if ! "$@" >>"$SETUP_LOG" 2>&1; then
        log "failed: $*; the end of $SETUP_LOG:"
        tail -n 40 "$SETUP_LOG" >&2
        return 1
    fi
}

have() {  # have DIST VERSION: is DIST==VERSION installed in the venv?
    "$PY" - "$1" "$2" <<'PYEOF'
import sys
from importlib import metadata
try:
    found = metadata.version(sys.argv[1]).split('+')[0]  # 2.13.0+cpu
    sys.exit(0 if found == sys.argv[2] else 1)
except metadata.PackageNotFoundError:
    sys.exit(1)
PYEOF
}

# importable MOD...: are these modules installed (found, not imported: a
# readiness check must not pay for importing torch, sklearn or onnx)?
importable() {
    "$PY" - "$@" <<'PYEOF'
import sys
from importlib.util import find_spec
sys.exit(0 if all(find_spec(m) is not None for m in sys.argv[1:]) else 1)
PYEOF
}

# mmcv_has_ops: does the installed mmcv carry its compiled ops (mmcv/_ext)?
mmcv_has_ops() {
    "$PY" - <<'PYEOF'
import sys
from importlib import metadata
try:
    files = metadata.files('mmcv') or []
except metadata.PackageNotFoundError:
    sys.exit(1)
ext = [f for f in files if str(f).startswith('mmcv/_ext')]
sys.exit(0 if ext and all(f.locate().is_file() for f in ext) else 1)
PYEOF
}

# sourced: the functions only
if [ "${BASH_SOURCE[0]}" != "$0" ]; then
    return 0
fi

set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${MMCALIDET_VENV:-$ROOT/.venv}"
CACHE="${MMCALIDET_CACHE:-$HOME/.cache/mmcalidet/wheels}"
PY="$VENV/bin/python"
PYTHON="${PYTHON:-python3}"
MMCV_VERSION=2.1.0
TORCH_VERSION=2.13.0
OPENCV=opencv-python==4.14.0.94  # what mmcv/mmengine require (libGL is here)


if [ ! -x "$PY" ]; then
    log "creating $VENV"
    "$PYTHON" -m venv "$VENV"
fi

# pip's and the builds' own output goes to a log file; the console keeps
# the stage lines, and the log's end when a step fails
SETUP_LOG="$VENV/setup.log"
pip_q() { logged "$PY" -m pip --disable-pip-version-check -q "$@"; }

# 1. Build tools and torch (torch 2.13.0 CPU lies on this disk for pip).
if ! have setuptools 80.9.0 || ! have torch "$TORCH_VERSION" \
        || ! importable Cython numpy wheel; then
    log "installing build requirements and torch==$TORCH_VERSION"
    pip_q install -r "$ROOT/requirements/build.txt" "torch==$TORCH_VERSION"
fi

# 2. mmcalidet itself, editable: compiles the Cython extension in place and
#    links tools/ and configs/ into mmcalidet/.mim. It needs neither mmcv nor
#    mmdet, so it goes before mmcv's long build: a failure shows early.
if ! "$PY" - "$ROOT" <<'PYEOF' 2>/dev/null
import os, sys
os.environ['MMCALIDET_LIGHT'] = '1'
import mmcalidet
from mmcalidet.priors import _cooccurrence  # noqa: F401  (compiled)
root = os.path.realpath(sys.argv[1])
pkg = os.path.realpath(os.path.dirname(mmcalidet.__file__))
ok = pkg == os.path.join(root, 'mmcalidet') and os.path.isdir(
    os.path.join(pkg, '.mim', 'configs'))
sys.exit(0 if ok else 1)
PYEOF
then
    log "installing mmcalidet (editable) from $ROOT"
    (cd "$ROOT" && pip_q install --no-deps --no-build-isolation -e .)
fi
# mim 0.3.9 looks for <site-packages>/mmcalidet/.mim; a PEP 660 editable
# install leaves only a finder there, so link the package folder in.
SITE="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
if [ "$(readlink "$SITE/mmcalidet" 2>/dev/null)" != "$ROOT/mmcalidet" ]; then
    ln -sfn "$ROOT/mmcalidet" "$SITE/mmcalidet"
fi
# A .pyx newer than its compiled module (e.g. after a pull): rebuild it.
for pyx in "$ROOT"/mmcalidet/priors/*.pyx; do
    so="$(ls "${pyx%.pyx}".*.so 2>/dev/null | head -n1 || true)"
    if [ -z "$so" ] || [ "$pyx" -nt "$so" ]; then
        log "rebuilding the Cython extension"
        (cd "$ROOT" && logged "$PY" setup.py -q build_ext --inplace)
        break
    fi
done
# 3. openmim without openxlab (which would pin setuptools back to 60), and
#    the deploy extra: neither needs mmcv either.
if ! have openmim 0.3.9; then
    log "installing openmim (without opendatalab/openxlab)"
    pip_q install click colorama model-index rich tabulate requests pandas
    pip_q install --no-deps openmim==0.3.9
fi

# the deploy extra (ONNX export and ONNX Runtime), which the tests exercise
if ! importable onnx onnxruntime; then
    log "installing onnx and onnxruntime (the deploy extra)"
    pip_q install -r "$ROOT/requirements/deploy.txt"
fi

# 4. mmcv with ops: from the wheel cache, else built once into it. With a
#    CUDA toolkit and a CUDA torch: with the CUDA ops (a CPU-only mmcv
#    already installed is then replaced).
CUDA_TAG="$(mmcv_cuda_tag "$PY")"
mmcv_ready() {  # the pinned mmcv with its ops (CUDA ops for a CUDA build)
    have mmcv "$MMCV_VERSION" && mmcv_has_ops || return 1
    if [ -n "$CUDA_TAG" ]; then
        "$PY" -c 'from mmcv.ops import get_compiling_cuda_version
assert get_compiling_cuda_version() != "not available"' 2>/dev/null
    fi
}
if ! mmcv_ready; then
    PYTAG="$("$PY" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')"
    WHEELDIR="$(mmcv_wheel_dir "$CACHE" "$TORCH_VERSION" "$PYTAG" "$CUDA_TAG")"
    mkdir -p "$WHEELDIR"
    WHEEL="$(ls "$WHEELDIR"/mmcv-"$MMCV_VERSION"-*.whl 2>/dev/null | head -n1 || true)"
    if [ -z "$WHEEL" ]; then
        # build into a folder inside the cache: the final mv is then an
        # atomic rename, so a killed build leaves no partial wheel behind
        TMPW="$(mktemp -d "$CACHE/.build.XXXXXX")"
        if [ -n "$CUDA_TAG" ]; then
            NVCC="$(find_nvcc)"
            log "building mmcv==$MMCV_VERSION with CUDA ops ($CUDA_TAG, $NVCC;" \
                "TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-the visible GPUs})"
            MMCV_WITH_OPS=1 FORCE_CUDA=1 CUDA_HOME="${CUDA_HOME:-$(dirname "$(dirname "$NVCC")")}" \
                MAX_JOBS="${MAX_JOBS:-$(nproc)}" \
                logged "$PY" -m pip --disable-pip-version-check wheel --no-deps \
                --no-build-isolation --no-binary mmcv -w "$TMPW" "mmcv==$MMCV_VERSION"
        else
            log "building mmcv==$MMCV_VERSION with ops (about 12 minutes on 2" \
                "cores; log: $SETUP_LOG)"
            MMCV_WITH_OPS=1 FORCE_CUDA=0 MAX_JOBS="${MAX_JOBS:-$(nproc)}" \
                logged "$PY" -m pip --disable-pip-version-check wheel --no-deps \
                --no-build-isolation --no-binary mmcv -w "$TMPW" "mmcv==$MMCV_VERSION"
        fi
        mv "$TMPW"/mmcv-*.whl "$WHEELDIR"/
        rm -rf "$TMPW"
        WHEEL="$(ls "$WHEELDIR"/mmcv-"$MMCV_VERSION"-*.whl | head -n1)"
    else
        log "reusing cached $WHEEL"
    fi
    # mmcv's own dependencies first, then mmcv without a resolver run
    pip_q install addict packaging Pillow pyyaml yapf "$OPENCV"
    if [ -n "$CUDA_TAG" ]; then
        # replaces a CPU-only mmcv of the same version
        pip_q install --no-deps --force-reinstall "$WHEEL"
    else
        pip_q install --no-deps "$WHEEL"
    fi
fi

# 5. mmengine, mmdet (which requires mmcv) and the rest of the runtime.
if ! have mmengine 0.10.7 || ! have mmdet 3.3.0 || ! have opencv-python 4.14.0.94 \
        || ! importable pycocotools matplotlib tqdm pytest xdist sklearn; then
    log "installing mmengine, mmdet and runtime requirements"
    pip_q install -r "$ROOT/requirements/runtime.txt" -r "$ROOT/requirements/tests.txt"
fi
log "environment ready: $VENV"
