#!/usr/bin/env bash
# Run lmckit's checks: lint, format, types, tests. Creates the .venv if it is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
# pinned torch==2.13.0: the CPU wheel lies on disk; quiet when already satisfied
.venv/bin/pip install --quiet --disable-pip-version-check -e '.[test]'

.venv/bin/ruff check src tests benchmarks scripts
.venv/bin/ruff format --check src tests benchmarks scripts
# types: configured in pyproject.toml ([tool.mypy]: src/lmckit, strict on the public API)
.venv/bin/mypy
.venv/bin/python -m pytest "$@"
