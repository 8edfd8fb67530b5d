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

setup: $(BIN)/criogenai

demo: setup
	$(BIN)/criogenai demo

test: setup
	$(BIN)/ruff check src tests examples bench
	$(BIN)/mypy
	$(BIN)/pytest -q -n 3 --dist loadfile

bench: setup
	$(BIN)/python bench/bench_turn.py
