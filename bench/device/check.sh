#!/usr/bin/env bash
# The device check's one command on a CUDA host without network (bench/README.md, "Device check"):
# install the device kit that `python -m bench.device.kit fetch` made into build/device-kit/ (carry that
# folder there) into a folder of its own, without touching the image's packages, put it on PYTHONPATH, run.
#   bash bench/device/check.sh --out DIR [python -m bench.device.check flags]
set -euo pipefail
cd "$(dirname "$0")/../.."
kit=build/device-kit
site=build/device-site
python=${PYTHON:-python3}
if compgen -G "$kit/*.whl" >/dev/null; then
    "$python" -m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$site" "$kit"/*.whl
else
    echo "no wheels in $kit: run 'python -m bench.device.kit fetch' on a machine with a registry" >&2
fi
export PYTHONPATH="$PWD/$site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
exec "$python" -m bench.device.check "$@"
