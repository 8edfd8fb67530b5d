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

# Settings come from the environment: CRIOGENAI_BROKER_URL, CRIOGENAI_TOOLS, CRIOGENAI_SIGNING_SECRET,
# CRIOGENAI_QUEUES, CRIOGENAI_LOG_FORMAT, CRIOGENAI_METRICS_PORT. --events lets Flower follow the tasks.
CMD ["criogenai", "worker", "--pool", "prefork", "--events"]
