#!/usr/bin/env bash
# Set up (or refresh) the project's virtual environment. Sourced by the other scripts.
# The environment lives in .venv unless ASTRAFLOW_VENV names another place (CI keeps one in
# ~/.cache so that torch is not downloaded again for every fresh clone). It is (re)installed
# when pyproject.toml changed or the checkout moved; otherwise this takes a second.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python3}"
if ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  echo "error: AstraFlow needs Python >= 3.11 (found: $("$PY" --version 2>&1)); set PYTHON=/path/to/python3.11" >&2
  exit 1
fi
VENV="${ASTRAFLOW_VENV:-$ROOT/.venv}"
if [ ! -x "$VENV/bin/python" ]; then
  echo "==> creating virtual environment in $VENV"
  "$PY" -m venv "$VENV"
fi
STAMP="$VENV/.astraflow-installed"
WANT="$(sha256sum "$ROOT/pyproject.toml" | cut -d' ' -f1) $ROOT"
if [ "$(cat "$STAMP" 2>/dev/null)" != "$WANT" ]; then
  echo "==> installing astraflow and its dependencies into $VENV (first time: a few minutes)"
  "$VENV/bin/python" -m pip install --upgrade --quiet --disable-pip-version-check pip
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -e "$ROOT[dev]"
  echo "$WANT" > "$STAMP"
fi
export PATH="$VENV/bin:$PATH"
