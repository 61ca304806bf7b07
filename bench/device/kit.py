"""The device kit: the Python packages a GPU host without network lacks, as wheels made on a machine with one.

    python -m bench.device.kit fetch          # here (no GPU needed): wheels into build/device-kit/
    bash bench/device/check.sh --out DIR      # there: installs them into build/device-site/, runs the check

The GPU image the device check is written for has Python 3.12, torch 2.11, transformers, numpy, httpx, h11,
safetensors, pytest, hypothesis, prometheus-client, anyio and uvloop, and nothing can be installed on it from
a registry. What it lacks, with every dependency of those that it lacks too:
- serving: orjson, starlette, hypercorn (and h2, hpack, hyperframe, priority, wsproto);
- export: torchao 0.18.0, the version we pin, which needs torch >= 2.11 (its C++ extensions are built on
  torch's stable ABI; `torchao/__init__.py` checks the version), so the device exports with torchao as
  every other machine does;
- the FP8 oracle: compressed-tensors 0.20.0 (torch >= 2.10), and pydantic, pydantic-core, annotated-types,
  typing-inspection and loguru.
The versions are the ones this project's environment has installed, read at fetch time, as CPython 3.12
manylinux wheels; `--no-deps` everywhere, so nothing the image already has (torch above all) is replaced.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
KIT_DIR = REPO / "build" / "device-kit"
MAX_KIT_BYTES = 48 * 2**20  # the whole working tree that travels to the device may be 64 MiB
PYTHON_VERSION = "3.12"
PLATFORMS = (
    "manylinux_2_28_x86_64",
    "manylinux_2_24_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
)

KIT = (  # distribution names; each is fetched at the version this environment has installed
    "orjson", "starlette", "hypercorn", "h2", "hpack", "hyperframe", "priority", "wsproto",
    "torchao", "compressed-tensors", "pydantic", "pydantic-core", "annotated-types", "typing-inspection",
    "loguru",
)  # fmt: skip


def kit_versions() -> dict[str, str]:
    """Each kit package at the version installed here: transitive ones (loguru, pydantic) are not pinned by
    pyproject.toml and move with the registry, so a table of versions would drift from what runs here."""
    return {name: metadata.version(name) for name in KIT}


def fetch_command(destination: Path) -> list[str]:
    platforms = [arg for platform in PLATFORMS for arg in ("--platform", platform)]
    return [
        sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
        "--python-version", PYTHON_VERSION, "--implementation", "cp", *platforms, "--dest", str(destination),
        *(f"{name}=={version}" for name, version in kit_versions().items()),
    ]  # fmt: skip


def fetch(destination: Path = KIT_DIR) -> int:
    destination.mkdir(parents=True, exist_ok=True)
    for stale in destination.glob("*.whl"):  # an older kit's wheels would install two versions of one
        stale.unlink()
    print(f"fetching {len(KIT)} wheels for CPython {PYTHON_VERSION} into {destination} ...", flush=True)
    done = subprocess.run(fetch_command(destination))
    if done.returncode:
        print("pip download failed (it needs a package registry)", file=sys.stderr)
        return 2
    wheels = sorted(destination.glob("*.whl"))
    total = sum(w.stat().st_size for w in wheels)
    for wheel in wheels:
        print(f"  {wheel.stat().st_size / 2**20:6.2f} MiB  {wheel.name}")
    print(f"{len(wheels)} wheels, {total / 2**20:.1f} MiB")
    if len(wheels) != len(KIT):
        print(f"expected {len(KIT)} wheels, found {len(wheels)}", file=sys.stderr)
        return 2
    if total > MAX_KIT_BYTES:
        print(f"the kit is over {MAX_KIT_BYTES / 2**20:.0f} MiB", file=sys.stderr)
        return 2
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("command", choices=["fetch"])
    parser.add_argument("--dest", type=Path, default=KIT_DIR, help=f"where the wheels go [{KIT_DIR}]")
    args = parser.parse_args(argv)
    return fetch(args.dest)


if __name__ == "__main__":
    sys.exit(main())
