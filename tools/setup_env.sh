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
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${MMCALIDET_VENV:-$ROOT/.venv}"
CACHE="${MMCALIDET_CACHE:-$HOME/.cache/mmcalidet/wheels}"
PY="$VENV/bin/python"
PYTHON="${PYTHON:-python3}"
MMCV_VERSION=2.1.0
TORCH_VERSION=2.13.0
OPENCV=opencv-python==4.14.0.94  # what mmcv/mmengine require (libGL is here)

log() { echo "[setup_env] $*" >&2; }

if [ ! -x "$PY" ]; then
    log "creating $VENV"
    "$PYTHON" -m venv "$VENV"
fi

pip_q() { "$PY" -m pip --disable-pip-version-check -q "$@"; }

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

# 1. Build tools and torch (torch 2.13.0 CPU lies on this disk for pip).
if ! have setuptools 80.9.0 || ! have torch "$TORCH_VERSION" \
        || ! "$PY" -c 'import Cython, numpy, wheel' 2>/dev/null; then
    log "installing build requirements and torch==$TORCH_VERSION"
    pip_q install -r "$ROOT/requirements/build.txt" "torch==$TORCH_VERSION"
fi

# 2. mmcv with ops: from the wheel cache, else built once into it.
if ! have mmcv "$MMCV_VERSION" \
        || ! "$PY" -c 'from mmcv.ops import MultiScaleDeformableAttention' 2>/dev/null; then
    PYTAG="$("$PY" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')"
    WHEELDIR="$CACHE/torch-$TORCH_VERSION-$PYTAG"
    mkdir -p "$WHEELDIR"
    WHEEL="$(ls "$WHEELDIR"/mmcv-"$MMCV_VERSION"-*.whl 2>/dev/null | head -n1 || true)"
    if [ -z "$WHEEL" ]; then
        log "building mmcv==$MMCV_VERSION with ops (about 15 minutes on 2 cores)"
        # build into a folder inside the cache: the final mv is then an
        # atomic rename, so a killed build leaves no partial wheel behind
        TMPW="$(mktemp -d "$CACHE/.build.XXXXXX")"
        MMCV_WITH_OPS=1 FORCE_CUDA=0 MAX_JOBS="${MAX_JOBS:-$(nproc)}" \
            "$PY" -m pip --disable-pip-version-check wheel --no-deps \
            --no-build-isolation --no-binary mmcv -w "$TMPW" "mmcv==$MMCV_VERSION"
        mv "$TMPW"/mmcv-*.whl "$WHEELDIR"/
        rm -rf "$TMPW"
        WHEEL="$(ls "$WHEELDIR"/mmcv-"$MMCV_VERSION"-*.whl | head -n1)"
    else
        log "reusing cached $WHEEL"
    fi
    # mmcv's own dependencies first, then mmcv without a resolver run
    pip_q install addict packaging Pillow pyyaml yapf "$OPENCV"
    pip_q install --no-deps "$WHEEL"
fi

# 3. mmengine, mmdet and the rest of the runtime.
if ! have mmengine 0.10.7 || ! have mmdet 3.3.0 || ! have opencv-python 4.14.0.94 \
        || ! "$PY" -c 'import pycocotools, matplotlib, tqdm, pytest, sklearn' 2>/dev/null; then
    log "installing mmengine, mmdet and runtime requirements"
    pip_q install -r "$ROOT/requirements/runtime.txt" -r "$ROOT/requirements/tests.txt"
fi

# 4. openmim without openxlab (which would pin setuptools back to 60).
if ! have openmim 0.3.9; then
    log "installing openmim (without opendatalab/openxlab)"
    pip_q install click colorama model-index rich tabulate requests pandas
    pip_q install --no-deps openmim==0.3.9
fi

# 5. mmcalidet itself, editable: compiles the Cython extension in place and
#    links tools/ and configs/ into mmcalidet/.mim.
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
        (cd "$ROOT" && "$PY" setup.py -q build_ext --inplace >/dev/null)
        break
    fi
done
log "environment ready: $VENV"
