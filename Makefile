# Two entry points (see README.md): `make demo` and `make test`.
# Both set up .venv/ first (idempotent; the mmcv wheel is cached outside
# the clone, in ~/.cache/mmcalidet/wheels).
PY := .venv/bin/python
DATA ?= ../shared/datasets
OUT ?= outputs/demo
export MMCALIDET_DATA := $(abspath $(DATA))

.PHONY: env demo test

env:
	bash tools/setup_env.sh

demo: env
	$(PY) tools/misc/relation_stats_demo.py --data $(DATA) --out-dir $(OUT)

test: env
	$(PY) -m pytest tests -q -p no:cacheprovider
