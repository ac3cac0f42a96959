# Two entry points (see README.md): `make demo` and `make test`.
# Both set up .venv/ first (idempotent; the mmcv wheel is cached outside
# the clone, in ~/.cache/mmcalidet/wheels).
PY := .venv/bin/python
# the datasets: beside this clone, else beside the local checkout it was
# cloned from (a throw-away clone in a temporary folder finds its origin's)
ORIGIN := $(shell git config --get remote.origin.url 2>/dev/null)
DATA ?= $(firstword $(wildcard ../shared/datasets $(if $(ORIGIN),$(ORIGIN)/../shared/datasets)) ../shared/datasets)
OUT ?= outputs/demo
export MMCALIDET_DATA := $(abspath $(DATA))
# the checkout's modules keep their compiled bytecode (and pytest its
# rewritten test modules) between runs, whatever the shell says: a second
# run collects the suite in 9 s instead of 13 s per worker
unexport PYTHONDONTWRITEBYTECODE

.PHONY: env check-data demo stats-demo benchmark test test-fast app

env:
	bash tools/setup_env.sh

# the tests and stats-demo read COCO data from DATA: say so in one line
# rather than fail test by test
check-data:
	@test -d "$(MMCALIDET_DATA)" || { echo "the datasets folder \
	$(MMCALIDET_DATA) does not exist: put shared/datasets beside the \
	clone (or beside the checkout it was cloned from), or run with \
	DATA=/path/to/datasets" >&2; exit 1; }

# the main job: the short context-shift benchmark (generate -> train the
# plain tiny DINO 600 iterations -> calibrate a CaliDINO on its cached
# decoder outputs -> inject priors, against the DINO with the marginal
# re-weighting -> tables + plots; see README for the measured time)
# (projects/context_shift, run from the root with it on PYTHONPATH as
# mmdet's projects are)
# (DEMO_ARGS: more benchmark.py options, e.g. DEMO_ARGS=--profile)
demo: env
	PYTHONPATH=$(CURDIR) $(PY) projects/context_shift/tools/benchmark.py \
	    --quick --dino-iters 600 --posthoc reweight --out-dir $(OUT) \
	    $(DEMO_ARGS)

# the prior page on the model `make demo` trained (tools/demo/prior_app.py;
# APP_ARGS: e.g. APP_ARGS='--port 7861', or CONFIG CHECKPOINT of another
# model), served on http://127.0.0.1:7860
app: env
	PYTHONPATH=$(CURDIR) $(PY) tools/demo/prior_app.py $(APP_ARGS)

# the full-length benchmark (DINO 3000 iterations, 27-45 min on 2 cores,
# then 10,000 calibrator updates and every table; 65.5 min in all without
# the subset table, measured on data seed 1: projects/context_shift/README.md);
# BENCHMARK_ARGS='--detector rtmdet' (or faster-rcnn) for the one- or
# two-stage detector
benchmark: env
	PYTHONPATH=$(CURDIR) $(PY) projects/context_shift/tools/benchmark.py \
	    $(BENCHMARK_ARGS)

# COCO 2017 relation statistics beside the paper's figures (seconds)
stats-demo: check-data env
	$(PY) tools/misc/relation_stats_demo.py --data $(DATA) --out-dir $(OUT)

# the suite in TEST_JOBS worker processes (default: one per core and one
# more, at most 4: a third worker on 2 cores runs while the others wait on
# data loader workers, servers and the browser: pytest 371 -> 343 s with
# -n 3 against -n 2, back to back on a 2-core AMD EPYC VM, 2026-12-08; a
# test file stays in one worker, so its module fixtures run once;
# the files go out in conftest.py's order, those with most slow tests
# first), each with TEST_THREADS torch threads (default: the cores shared
# out); TEST_JOBS=0 runs it in this process
NPROC := $(shell nproc 2>/dev/null || echo 2)
TEST_JOBS ?= $(shell n=$$(( $(NPROC) + 1 )); [ $$n -gt 4 ] && n=4; echo $$n)
TEST_THREADS ?= $(shell j=$(TEST_JOBS); [ $$j -lt 1 ] && j=1; \
    t=$$(( $(NPROC) / j )); [ $$t -lt 1 ] && t=1; echo $$t)
test: check-data env
	OMP_NUM_THREADS=$(TEST_THREADS) MKL_NUM_THREADS=$(TEST_THREADS) \
	    $(PY) -m pytest tests projects -q -p no:cacheprovider --durations=20 \
	    -n $(TEST_JOBS) --dist loadfile --no-loadscope-reorder

# the same without the tests marked slow (trainings, ONNX exports, tools
# run as subprocesses, the prior page in a browser): the unit tests, in
# FAST_JOBS workers (default: one per core, at most 4: nothing here waits
# on another process)
FAST_JOBS ?= $(shell n=$(NPROC); [ $$n -gt 4 ] && n=4; echo $$n)
test-fast: check-data env
	OMP_NUM_THREADS=$(TEST_THREADS) MKL_NUM_THREADS=$(TEST_THREADS) \
	    $(PY) -m pytest tests projects -m "not slow" -q -p no:cacheprovider \
	    --durations=20 -n $(FAST_JOBS) --dist loadfile --no-loadscope-reorder
