#!/usr/bin/env bash
# Serve drafts: ./serve.sh [flags]  (= python -m drafter [flags]; every flag also reads DRAFTER_<FLAG>).
# Works from any directory; relative --model paths stay relative to the caller's directory.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
# An active virtualenv wins, then the project's .venv, then whatever python3 is on PATH.
if [[ -n "${PYTHON:-}" ]]; then
  python="$PYTHON"
elif [[ -z "${VIRTUAL_ENV:-}" && -x "$root/.venv/bin/python" ]]; then
  python="$root/.venv/bin/python"
else
  python="$(command -v python || command -v python3)"
fi
exec "$python" -m drafter "$@"
