#!/usr/bin/env bash
# Train with one process per GPU (or, without GPUs, per CPU process group
# member: tools/train.py then uses the gloo backend).
#
# Usage: tools/dist_train.sh CONFIG NUM_PROCS [train.py options...]
# Environment: NNODES, NODE_RANK, MASTER_ADDR, PORT (torchrun's rendezvous),
# PYTHON (the interpreter; default: the project's .venv/bin/python when it
# exists, else python on the PATH).
set -e
CONFIG=$1
GPUS=$2
NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
PORT=${PORT:-29500}
MASTER_ADDR=${MASTER_ADDR:-"127.0.0.1"}
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
if [ -z "$PYTHON" ]; then
    if [ -x "$ROOT/.venv/bin/python" ]; then
        PYTHON="$ROOT/.venv/bin/python"
    else
        PYTHON=python
    fi
fi

PYTHONPATH="$ROOT":$PYTHONPATH \
"$PYTHON" -m torch.distributed.run \
    --nnodes="$NNODES" \
    --node_rank="$NODE_RANK" \
    --master_addr="$MASTER_ADDR" \
    --nproc_per_node="$GPUS" \
    --master_port="$PORT" \
    "$ROOT/tools/train.py" \
    "$CONFIG" \
    --launcher pytorch "${@:3}"
