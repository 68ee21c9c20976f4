# The README's two commands. Each does its own set-up (tools/setup_env.sh) on a fresh machine.
PY = $$(cat .deepinfer-python)
PROMPT ?= def fibonacci(n):

.PHONY: setup demo test bench results lint
setup:
	@bash tools/setup_env.sh

## make demo: complete a Python function header with the embedded default model
demo: setup
	@$(PY) -m deepinfer_engine.cli generate --prompt '$(PROMPT)' --max-tokens 64 --temperature 0

## make test: the CPU test suite of every package plus the cross-package tests, on two pytest-xdist
## workers where the plugin is installed (one file per worker at a time: a module's server or DP
## ranks start once)
XDIST = $$($(PY) -c 'import xdist' 2>/dev/null && echo --numprocesses 2 --dist loadfile)
test: setup
	@$(PY) -m pytest packages tests -q --benchmark-skip -m "not slow" $(XDIST)

## make bench: every package's pytest-benchmark suite
bench: setup
	@$(PY) -m pytest packages --benchmark-only -q

## make results: the README's and docs/benchmarks.md's tables and docs/img/ plots from docs/results/*.json
results: setup
	@$(PY) tools/render_results.py

lint: setup
	@$(PY) -m ruff check packages tests tools
