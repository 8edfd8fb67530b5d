# One image for the whole fleet: workers, the example agent process and the CLI.
#   docker build -t criogenai .          docker compose up --scale worker=3
FROM python:3.12-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app

# The package first (its layer is reused while only the tool modules change).
COPY pyproject.toml README.md ./
COPY src ./src
RUN pip install ".[metrics]"

# Tool modules are imported by name (CRIOGENAI_TOOLS), relative to /app.
COPY examples ./examples

RUN useradd --create-home --uid 10001 criogenai
USER criogenai

# Health checks: the worker serves /livez and /readyz on this port (loopback), and the probe is one
# HTTP request (about 0.1 s and 20 MB of a Python without criogenai imported; `celery inspect ping`
# costs 0.9 s and 69 MB).
ENV CRIOGENAI_HEALTH_PORT=9809
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 \
  CMD python -c "import os, urllib.request as u; u.urlopen('http://127.0.0.1:%s/readyz' % os.environ['CRIOGENAI_HEALTH_PORT'], timeout=4)"

# Settings come from the environment: CRIOGENAI_BROKER_URL, CRIOGENAI_TOOLS, CRIOGENAI_SIGNING_SECRET,
# CRIOGENAI_QUEUES, CRIOGENAI_LOG_FORMAT, CRIOGENAI_METRICS_PORT. --events lets Flower follow the tasks.
CMD ["criogenai", "worker", "--pool", "prefork", "--events"]
