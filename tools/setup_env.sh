#!/usr/bin/env bash
# Prepares the Python environment that `make demo` / `make test` use, then writes the path of its
# interpreter to .deepinfer-python. Idempotent and quick when nothing changed.
#
#   - An interpreter that already has torch (the GPU machine's python3) is reused as is, and the
#     packages are installed into it editable, without build isolation or dependency resolution
#     (that machine has no package index).
#   - Otherwise a virtual environment .venv is made, torch==2.13.0 (the CPU wheel) installed into
#     it, then the four packages editable with their test extras, then xgrammar (structured output)
#     with --no-deps plus apache-tvm-ffi: its declared deps pull transformers and triton, which the
#     engine never imports (pydantic, numpy, torch come with the test extras), then matplotlib for
#     the results renderer and pytest-xdist for the test command.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
packages=(packages/deepinfer-sched packages/deepinfer-kernels packages/deepinfer-model packages/deepinfer-engine)

if [ -z "${DEEPINFER_FORCE_VENV:-}" ] && python3 -c "import torch" 2>/dev/null; then
  py=$(python3 -c "import sys; print(sys.executable)")
  pip_flags=(--no-deps)
  if "$py" -c "import nanobind, scikit_build_core" 2>/dev/null; then pip_flags+=(--no-build-isolation); fi
  extras=""
else
  [ -x .venv/bin/python ] || python3 -m venv .venv
  py=$root/.venv/bin/python
  "$py" -c "import torch" 2>/dev/null || "$py" -m pip install -q torch==2.13.0
  pip_flags=()
  extras="[test]"
fi

# Reinstall only when a package's build inputs changed (the C++ build is the slow part).
stamp=.deepinfer-setup.stamp
digest=$( (echo "$py"; find "${packages[@]}" \( -name pyproject.toml -o -name CMakeLists.txt -o -path '*/csrc/*' \) \
           -type f -not -path '*/build/*' -print0 | sort -z | xargs -0 sha1sum) | sha1sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$digest" ] || ! "$py" -c "import deepinfer_engine, deepinfer_sched" 2>/dev/null; then
  args=()
  for p in "${packages[@]}"; do args+=(-e "$p$extras"); done
  echo "setting up: installing the four packages (log: .deepinfer-setup.log)" >&2
  if ! "$py" -m pip install -q "${pip_flags[@]}" "${args[@]}" > .deepinfer-setup.log 2>&1; then
    tail -40 .deepinfer-setup.log >&2
    exit 1
  fi
  echo "$digest" > "$stamp"
fi
# Structured output: xgrammar without its declared dependencies (see the engine's pyproject.toml).
# The GPU machine's interpreter gets xgrammar and pydantic from its prepared bundle.
xgr_check="from deepinfer_engine.structured_output.xgrammar_compat import import_xgrammar; import_xgrammar()
from importlib.metadata import version; assert tuple(map(int, version('xgrammar').split('.')[:3])) >= (0, 2, 9)"
if [ -n "$extras" ] && ! "$py" -c "$xgr_check" 2>/dev/null; then
  "$py" -m pip install -q --no-deps "xgrammar>=0.2.9,<0.3" "apache-tvm-ffi>=0.1.11" >> .deepinfer-setup.log 2>&1 \
    || { tail -20 .deepinfer-setup.log >&2; exit 1; }
fi
# The workspace's own tools, no package's dependencies, in one pip call: matplotlib draws the docs'
# plots (tools/render_results.py); pytest-xdist runs `make test` on two workers (the Makefile runs
# it on one where the plugin is missing, as on the GPU machine's interpreter).
tools=()
"$py" -c "import matplotlib" 2>/dev/null || tools+=("matplotlib>=3.7")
"$py" -c "import xdist" 2>/dev/null || tools+=("pytest-xdist>=3.5")
if [ -n "$extras" ] && [ ${#tools[@]} -gt 0 ]; then
  "$py" -m pip install -q "${tools[@]}" >> .deepinfer-setup.log 2>&1 || { tail -20 .deepinfer-setup.log >&2; exit 1; }
fi
echo "$py" > .deepinfer-python
