# syntax=docker/dockerfile:1
# One image for every AstraFlow role: `docker run astraflow:dev rollout CONFIG ...`.
# compose.yaml builds it as astraflow:dev; see docs/operations.md.
#
# torch from PyPI brings the CUDA libraries (several GB). For a CPU-only image:
#   docker compose build --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
FROM python:3.11-slim

ARG TORCH_INDEX_URL=

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app

# The project with the Kafka client (roles talk to the compose Kafka through it).
COPY pyproject.toml README.md ./
COPY astraflow ./astraflow
RUN pip install ${TORCH_INDEX_URL:+--extra-index-url "$TORCH_INDEX_URL"} ".[kafka]"

# Example experiment configs: /app/examples/quickstart.yaml is what compose.yaml runs.
COPY examples ./examples

# Non-root. /runs is created here, owned by that user, so a fresh named volume mounted on it
# inherits the ownership and the roles can write the run directory and the weight store.
RUN useradd --create-home --uid 1000 --shell /usr/sbin/nologin astraflow \
    && mkdir -p /runs \
    && chown astraflow:astraflow /runs
USER astraflow
WORKDIR /runs

ENTRYPOINT ["astraflow"]
CMD ["--help"]
