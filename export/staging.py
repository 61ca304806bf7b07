"""Where an export writes: a directory staged beside its destination and renamed onto it only when the whole
export succeeded, so a failed or interrupted export leaves no half-written checkpoint; and the export's one
error type, whose message the CLI prints without a traceback.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path


class ExportError(Exception):
    """A problem with the export's inputs; the message says what, and the CLI prints it without a traceback."""


@contextlib.contextmanager
def staged_directory(destination: Path, force: bool) -> Iterator[Path]:
    """A temporary directory next to `destination`, renamed onto it when the block succeeds and deleted
    when it fails; an existing destination is refused unless `force`, and replaced only at the end."""
    if destination.exists() and not force:
        raise ExportError(f"destination {str(destination)!r} already exists; pass --force to replace it")
    destination.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{destination.name}.", suffix=".tmp", dir=destination.parent))
    try:
        yield staging
        publish_permissions(staging)
        if destination.exists():
            old = destination.with_name(f".{destination.name}.old-{staging.name}")
            destination.rename(old)
            staging.rename(destination)
            shutil.rmtree(old) if old.is_dir() else old.unlink()
        else:
            staging.rename(destination)
    finally:
        if staging.exists():
            shutil.rmtree(staging)


def publish_permissions(directory: Path) -> None:
    """mkdtemp makes a private directory; give it and its files the modes the umask would have."""
    umask = os.umask(0)
    os.umask(umask)
    directory.chmod(0o777 & ~umask)
    for file in directory.iterdir():
        file.chmod(0o666 & ~umask)
