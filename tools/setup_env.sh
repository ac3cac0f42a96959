#!/usr/bin/env bash
# Create (or reuse) the project's virtual environment in .venv/ and install
# the pinned stack: torch 2.13.0 (CPU), mmengine 0.10.7, mmcv 2.1.0 built
# from source with its ops, mmdet 3.3.0, openmim, and mmcalidet itself
# (editable, with its Cython extensions).
#
# Idempotent: every step is skipped when what it makes is already there (a
# second run takes a few seconds).
# The mmcv wheel (a ~15 minute build on 2 cores) is kept outside the clone,
# in $MMCALIDET_CACHE (default ~/.cache/mmcalidet/wheels), so fresh clones
# reuse it.
#
# Installs go through uv (pinned, fetched once with pip into
# ~/.cache/mmcalidet/uv-<version>, or $MMCALIDET_UV), which creates the venv
# and links the packages from its cache (~/.cache/uv): a fresh clone is set
# up in seconds rather than minutes. uv is given pip's configured indexes,
# find-links and constraints and pip's choice among them
# (--index-strategy unsafe-best-match), so both install the same wheels.
# Without uv (MMCALIDET_NO_UV=1, or no way to fetch it), or when a uv step
# fails, pip does the step as before.
#
# GPU: when a CUDA toolkit (nvcc) and a CUDA build of torch are present
# (install torch==2.13.0 from a CUDA index into the venv first, see
# docs/get_started.md), mmcv is built with its CUDA ops (FORCE_CUDA=1) and
# cached apart from the CPU wheel (torch-<version>-cu<XY>-<python>).
# MMCALIDET_CPU_ONLY=1 forces the CPU build.
#
# Sourced (`source tools/setup_env.sh`), the script only defines its
# functions (find_nvcc, mmcv_cuda_tag, mmcv_wheel_dir, find_uv, bootstrap_uv,
# uv_pip_args, ext_cache_key, log, logged, and the readiness checks have,
# importable, mmcv_has_ops, which use $PY) and installs nothing.

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
# GPU is needed to build); nothing for a CPU build. torch/version.py is read
# without importing torch (seconds), which is the fallback.
mmcv_cuda_tag() {
    local cuda
    if [ "${MMCALIDET_CPU_ONLY:-0}" = 1 ] || [ -z "$(find_nvcc)" ]; then
        return 0
    fi
    cuda="$("$1" - 2>/dev/null <<'PYEOF' || true
import os.path as osp
import runpy
from importlib.util import find_spec

try:
    spec = find_spec('torch')
    path = osp.join(list(spec.submodule_search_locations)[0], 'version.py')
    cuda = runpy.run_path(path)['cuda']
except Exception:  # not found, or laid out otherwise: ask torch itself
    import torch
    cuda = torch.version.cuda
print(cuda or '')
PYEOF
)"
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

# find_uv DIR: the uv to install with: $MMCALIDET_UV, else DIR/bin/uv (the
# pinned copy fetched by bootstrap_uv); nothing when there is none or
# MMCALIDET_NO_UV=1.
find_uv() {
    if [ "${MMCALIDET_NO_UV:-0}" = 1 ]; then
        return 0
    fi
    if [ -n "${MMCALIDET_UV:-}" ]; then
        if [ -x "$MMCALIDET_UV" ]; then
            echo "$MMCALIDET_UV"
        fi
    elif [ -x "$1/bin/uv" ]; then
        echo "$1/bin/uv"
    fi
    return 0
}

# bootstrap_uv DIR VERSION PYTHON: fetch uv==VERSION with PYTHON's pip into
# DIR (through a temporary folder beside it, renamed at the end: an
# interrupted fetch leaves no half copy); status 1 when it cannot.
bootstrap_uv() {
    local tmp
    mkdir -p "$(dirname "$1")" || return 1
    tmp="$(mktemp -d "$1.XXXXXX")" || return 1
    if "$3" -m pip --disable-pip-version-check -q install --target "$tmp" \
            "uv==$2" >/dev/null 2>&1 && [ -x "$tmp/bin/uv" ] \
            && mv -T "$tmp" "$1" 2>/dev/null; then
        return 0
    fi
    rm -rf "$tmp"
    [ -x "$1/bin/uv" ]  # another run may have put it there meanwhile
}

# uv_pip_args PY: pip's configuration (`PY -m pip config list`: its files
# and PIP_* variables) as uv options, one a line: the index URLs,
# find-links, constraints and no-index; and, as "env NAME=VALUE" lines, its
# certificate bundle and timeout. Nothing when PY has no pip.
uv_pip_args() {
    "$1" - <<'PYEOF'
import ast
import subprocess
import sys

try:
    listed = subprocess.run(
        [sys.executable, '-m', 'pip', 'config', 'list'],
        capture_output=True, text=True, check=True).stdout
except (OSError, subprocess.CalledProcessError):
    sys.exit(0)
rank = {'global': 0, 'install': 1, ':env:': 2}  # pip's precedence
conf = {}
for line in listed.splitlines():
    key, sep, value = line.partition('=')
    section, _, name = key.rpartition('.')
    if not sep or section not in rank:
        continue
    try:
        value = str(ast.literal_eval(value))
    except (ValueError, SyntaxError):
        continue
    if rank[section] >= conf.get(name, (-1, ''))[0]:
        conf[name] = (rank[section], value)
conf = {name: value for name, (_, value) in conf.items()}
flags = {'index-url': '--index-url', 'extra-index-url': '--extra-index-url',
         'find-links': '--find-links', 'constraint': '--constraints'}
for name, flag in flags.items():
    for value in conf.get(name, '').split():
        print(f'{flag}\n{value}')
if conf.get('no-index', '').lower() in ('1', 'true', 'yes', 'on'):
    print('--no-index')
if conf.get('cert'):
    print(f"env SSL_CERT_FILE={conf['cert']}")
if conf.get('default-timeout'):
    print(f"env UV_HTTP_TIMEOUT={conf['default-timeout'].split('.')[0]}")
PYEOF
}

# ext_cache_key PY ROOT: the name of mmcalidet's compiled extensions in the
# cache: a hash of their sources (mmcalidet/**/*.pyx, .pxd, .pxi and
# setup.py, which holds the compiler flags, and MMCALIDET_EXT_OPT, which
# picks their optimisation level), the Cython and numpy versions, PY's extension
# suffix (Python version and platform) and the C compiler's version.
# Nothing when PY lacks Cython or numpy.
ext_cache_key() {
    "$1" - "$2" <<'PYEOF'
import glob
import hashlib
import os
import os.path as osp
import subprocess
import sys
import sysconfig
from importlib import metadata

root = sys.argv[1]
h = hashlib.sha256()
try:
    for dist in ('Cython', 'numpy'):
        h.update(f'{dist}=={metadata.version(dist)}\n'.encode())
except metadata.PackageNotFoundError:
    sys.exit(0)
h.update(sysconfig.get_config_var('EXT_SUFFIX').encode())
h.update(os.environ.get('MMCALIDET_EXT_OPT', '-O3').encode())
cc = (sysconfig.get_config_var('CC') or 'cc').split()[0]
try:
    h.update(subprocess.run([cc, '--version'], capture_output=True,
                            text=True).stdout.encode())
except OSError:
    pass
sources = sorted(
    path for ext in ('pyx', 'pxd', 'pxi') for path in glob.glob(
        osp.join(root, 'mmcalidet', '**', f'*.{ext}'), recursive=True))
for path in sources + [osp.join(root, 'setup.py')]:
    with open(path, 'rb') as f:
        h.update(osp.relpath(path, root).encode() + b'\0' + f.read())
print(h.hexdigest()[:20])
PYEOF
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

# compile_bytecode PY SITE STAMP [CACHE]: byte-compile SITE's packages with PY
# once per set of installed distributions (STAMP holds the set it was done
# for). uv installs no bytecode, and an interpreter that may not write it
# (PYTHONDONTWRITEBYTECODE, a read-only venv) compiles torch, mmcv and mmdet
# from source at every start: about 10 s more for each process (a tool, a
# test worker). Compiling takes 20-30 s on 2 cores, so the result is kept in
# CACHE/bytecode/<python and distributions>.tar and a fresh venv with the
# same distributions unpacks it in a second. uv links each file from its
# own cache, so the sources keep their times, and Python checks each .pyc
# against its source's time and size before it uses it: a .pyc that does
# not match is ignored, never run. Package test folders are skipped; a file
# the interpreter cannot compile (torch's Python 3.12 samples) is reported
# in the log and left out, as import would.
compile_bytecode() {
    local py="$1" site="$2" stamp="$3" cache="${4:-}" dists key tar tmp
    dists="$(cd "$site" && ls -d ./*.dist-info 2>/dev/null | sort | tr '\n' ' ')"
    if [ "$(cat "$stamp" 2>/dev/null)" = "$dists" ]; then
        return 0
    fi
    if [ -n "$cache" ]; then
        key="$({ "$py" -c 'import sys; print(sys.version)'; echo "$dists"; } \
            | sha256sum | cut -c1-16)"
        tar="$cache/bytecode/$key.tar"
    fi
    if [ -n "$cache" ] && [ -f "$tar" ] && tar -xf "$tar" -C "$site" 2>/dev/null
    then
        log "reused the packages' bytecode from $tar"
    else
        log "compiling the installed packages to bytecode"
        "$py" -m compileall -q -j 0 -x '[/\\]tests[/\\]' "$site" \
            >>"${SETUP_LOG:-/dev/null}" 2>&1 || true
        # kept for the next venv (the package's own link is not followed);
        # a rename: other runs see the whole file or none
        if [ -n "$cache" ] && mkdir -p "$cache/bytecode" \
                && tmp="$(mktemp "$cache/bytecode/.part.XXXXXX")"; then
            if ! { (cd "$site" && find . -name '*.pyc' -path '*/__pycache__/*' \
                    | tar -cf "$tmp" -T -) && chmod 644 "$tmp" \
                    && mv "$tmp" "$tar"; }; then
                rm -f "$tmp"
            fi
        fi
    fi
    printf '%s' "$dists" >"$stamp"
}

# ext_modules ROOT: each Cython source's compiled module to be, relative to
# ROOT and without its suffix (mmcalidet/priors/_cooccurrence, ...); an
# *_avx2 module only on x86-64, as setup.py builds it.
ext_modules() {
    (cd "$1" && find mmcalidet -name '*.pyx' -not -path '*/.mim/*' \
        | sed 's/\.pyx$//' | sort) | case "$(uname -m)" in
        x86_64 | amd64 | AMD64) cat ;;
        *) grep -v '_avx2$' ;;
    esac
}

# install_ext: mmcalidet's compiled extensions into the source tree: copied
# from the cache when these sources were built before (by any clone), else
# built in place (setup.py build_ext --inplace) and stored in the cache,
# each under its path in the tree.
install_ext() {
    local key dir tmp module complete=1
    key="$(ext_cache_key "$PY" "$ROOT")"
    dir="$CACHE/mmcalidet-ext/$key"
    for module in $(ext_modules "$ROOT"); do
        ls "$dir/$module".*.so >/dev/null 2>&1 || complete=0
    done
    if [ -n "$key" ] && [ "$complete" = 1 ] \
            && cp -Rf "$dir/mmcalidet" "$ROOT/"; then
        log "reused the Cython extensions from $dir"
        return 0
    fi
    log "building the Cython extensions"
    (cd "$ROOT" && logged "$PY" setup.py -q build_ext --inplace)
    if [ -n "$key" ] && mkdir -p "$CACHE/mmcalidet-ext" \
            && tmp="$(mktemp -d "$CACHE/mmcalidet-ext/.build.XXXXXX")"; then
        # a rename: other runs see the whole folder or none of it (an
        # entry that lacks a module goes first)
        [ "$complete" = 1 ] || rm -rf "$dir"
        if ! { (cd "$ROOT" && for module in $(ext_modules "$ROOT"); do
                    cp --parents "$module".*.so "$tmp/" || exit 1
                done) && mv -T "$tmp" "$dir" 2>/dev/null; }; then
            rm -rf "$tmp"
        fi
    fi
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
UV_VERSION=0.13.9
UV_DIR="$HOME/.cache/mmcalidet/uv-$UV_VERSION"

# pip's, uv's and the builds' own output goes to a log file; the console
# keeps the stage lines, and the log's end when a step fails
mkdir -p "$VENV"
SETUP_LOG="$VENV/setup.log"

# use_uv: do the installs go through uv? Found (or fetched) on first use,
# so a run with nothing to install never looks; sets UV and UV_ARGS (pip's
# configured sources, see uv_pip_args).
UV=""
UV_ARGS=()
UV_LOOKED=0
use_uv() {
    local line name conf_py="$PYTHON"
    if [ "$UV_LOOKED" = 0 ]; then
        UV_LOOKED=1
        UV="$(find_uv "$UV_DIR")"
        if [ -z "$UV" ] && [ "${MMCALIDET_NO_UV:-0}" != 1 ] \
                && [ -z "${MMCALIDET_UV:-}" ]; then
            log "fetching uv==$UV_VERSION into $UV_DIR"
            if bootstrap_uv "$UV_DIR" "$UV_VERSION" "$PYTHON"; then
                UV="$UV_DIR/bin/uv"
            else
                log "no uv: installing with pip"
            fi
        fi
        if [ -n "$UV" ]; then
            if [ -x "$PY" ] && importable pip; then
                conf_py="$PY"  # the venv's pip.conf too
            fi
            while IFS= read -r line; do
                case "$line" in
                    "env "*)  # pip's certificates and timeout, unless set
                        line="${line#env }"
                        name="${line%%=*}"
                        if [ -z "${!name:-}" ]; then
                            export "${line?}"
                        fi ;;
                    *) UV_ARGS+=("$line") ;;
                esac
            done < <(uv_pip_args "$conf_py")
        fi
    fi
    [ -n "$UV" ]
}

# ensure_pip: the venv has pip (the mmcv build, mim and the fallback use it;
# a venv made by uv gets it in step 1).
ensure_pip() {
    importable pip || logged "$PY" -m ensurepip
}

# install_q ARGS...: `pip install ARGS` into the venv, through uv when there
# is one (and again with pip when uv fails), else with pip.
install_q() {
    if use_uv; then
        if "$UV" pip install --python "$PY" --index-strategy unsafe-best-match \
                "${UV_ARGS[@]}" "$@" >>"$SETUP_LOG" 2>&1; then
            return 0
        fi
        log "uv failed (its output: $SETUP_LOG); the step again with pip"
    fi
    ensure_pip && logged "$PY" -m pip --disable-pip-version-check -q install "$@"
}

if [ ! -x "$PY" ]; then
    log "creating $VENV"
    if ! { use_uv && "$UV" venv --allow-existing --no-python-downloads \
            --python "$(command -v "$PYTHON")" "$VENV" >>"$SETUP_LOG" 2>&1; }
    then
        "$PYTHON" -m venv "$VENV"
    fi
fi

# 1. Build tools, torch (torch 2.13.0 CPU lies on this disk for pip) and
#    pip itself (a venv made by uv has none).
if ! have setuptools 80.9.0 || ! have torch "$TORCH_VERSION" \
        || ! importable Cython numpy wheel pip; then
    log "installing build requirements and torch==$TORCH_VERSION"
    install_q -r "$ROOT/requirements/build.txt" "torch==$TORCH_VERSION" pip
fi

# 2. mmcalidet itself, editable (links tools/, configs/ and model-index.yml
#    into mmcalidet/.mim), then its compiled Cython extensions, in place.
#    Neither needs mmcv or mmdet, so they go before mmcv's long build: a
#    failure shows early. The editable install leaves the extensions out
#    (MMCALIDET_NO_EXT=1): a fresh clone copies them from
#    $CACHE/mmcalidet-ext (keyed by their sources, Cython, numpy, Python and
#    the compiler), and builds them (about 40 s) only when no clone has built
#    these sources yet.
if ! "$PY" -I - "$ROOT" <<'PYEOF' 2>/dev/null
import os, sys
from importlib import metadata
from importlib.util import find_spec
metadata.version('mmcalidet')  # installed (-I: not merely the cwd)
root = os.path.realpath(sys.argv[1])
pkg = os.path.realpath(os.path.dirname(find_spec('mmcalidet').origin))
mim = os.path.join(pkg, '.mim')
ok = pkg == os.path.join(root, 'mmcalidet') and os.path.isdir(
    os.path.join(mim, 'configs')) and os.path.exists(
        os.path.join(mim, 'model-index.yml'))
sys.exit(0 if ok else 1)
PYEOF
then
    log "installing mmcalidet (editable) from $ROOT"
    MMCALIDET_NO_EXT=1 install_q --no-deps --no-build-isolation -e "$ROOT"
fi
# mim 0.3.9 looks for <site-packages>/mmcalidet/.mim; a PEP 660 editable
# install leaves only a finder there, so link the package folder in.
SITE="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
if [ "$(readlink "$SITE/mmcalidet" 2>/dev/null)" != "$ROOT/mmcalidet" ]; then
    ln -sfn "$ROOT/mmcalidet" "$SITE/mmcalidet"
fi
# The extensions: one missing, or a .pyx (or a .pxi beside it) newer than its
# module (e.g. after a pull).
for module in $(ext_modules "$ROOT"); do
    so="$(ls "$ROOT/$module".*.so 2>/dev/null | head -n1 || true)"
    stale=""
    for src in "$ROOT/$module.pyx" "$(dirname "$ROOT/$module")"/*.pxi; do
        if [ -n "$so" ] && [ -e "$src" ] && [ "$src" -nt "$so" ]; then
            stale=1
        fi
    done
    if [ -z "$so" ] || [ -n "$stale" ]; then
        install_ext
        break
    fi
done

# 3. openmim without openxlab (which would pin setuptools back to 60), and
#    the deploy extra: neither needs mmcv either.
if ! have openmim 0.3.9; then
    log "installing openmim (without opendatalab/openxlab)"
    install_q click colorama model-index rich tabulate requests pandas
    install_q --no-deps openmim==0.3.9
fi

# the deploy extra (ONNX export and ONNX Runtime), which the tests exercise
if ! importable onnx onnxruntime; then
    log "installing onnx and onnxruntime (the deploy extra)"
    install_q -r "$ROOT/requirements/deploy.txt"
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
    install_q addict packaging Pillow pyyaml yapf "$OPENCV"
    if [ -n "$CUDA_TAG" ]; then
        # replaces a CPU-only mmcv of the same version
        install_q --no-deps --force-reinstall "$WHEEL"
    else
        install_q --no-deps "$WHEEL"
    fi
fi

# 5. mmengine, mmdet (which requires mmcv) and the rest of the runtime.
if ! have mmengine 0.10.7 || ! have mmdet 3.3.0 || ! have opencv-python 4.14.0.94 \
        || ! importable pycocotools matplotlib tqdm pytest xdist sklearn; then
    log "installing mmengine, mmdet and runtime requirements"
    install_q -r "$ROOT/requirements/runtime.txt" -r "$ROOT/requirements/tests.txt"
fi
# 5b. The app extra (gradio, the prior page) and its browser test's driver
#     (playwright, which drives Debian's chromium: never `playwright
#     install`); chromium itself from apt where it is missing and apt is ours.
if ! importable gradio gradio_client playwright; then
    log "installing the app extra (gradio) and playwright"
    install_q -r "$ROOT/requirements/app.txt" -r "$ROOT/requirements/tests.txt"
fi
if ! command -v chromium >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        log "installing chromium (apt; the prior page's browser test)"
        if ! { logged apt-get update -q && DEBIAN_FRONTEND=noninteractive \
                logged apt-get install -y -q chromium; }; then
            log "chromium was not installed: the prior page's browser" \
                "test will fail"
        fi
    else
        log "no chromium: the prior page's browser test needs it" \
            "(apt-get install chromium)"
    fi
fi
# 6. Bytecode for the installed packages (see compile_bytecode).
compile_bytecode "$PY" "$SITE" "$VENV/.bytecode-stamp" "$CACHE"
log "environment ready: $VENV"
