# One command for each job on a fresh machine; the README names them.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: setup demo test lint bench

$(BIN)/criogenai: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ".[dev]"
	touch $(BIN)/criogenai

# MCP servers and clients from npm that the MCP tests drive (into tests/node, not globally)
tests/node/node_modules/.package-lock.json: tests/node/package.json tests/node/package-lock.json
	cd tests/node && npm ci --no-audit --no-fund --quiet
	touch $@

setup: $(BIN)/criogenai tests/node/node_modules/.package-lock.json

demo: $(BIN)/criogenai
	$(BIN)/criogenai demo

test: setup
	$(BIN)/ruff check src tests examples bench
	$(BIN)/mypy
	$(BIN)/lint-imports  # the layer contracts in pyproject.toml [tool.importlinter]
	$(BIN)/pytest -q -n 3 --dist loadfile

bench: setup
	$(BIN)/python bench/bench_turn.py
