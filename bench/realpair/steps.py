"""How a fetch step runs so that any run can be killed and the next one continues: each step makes one
output (a file or a directory under the fetch directory) from inputs it can name, writes it under
`<output>.partial`, renames it into place when complete, and then writes its done record,
`done/<output>.json`: the step, its inputs' identity (what it was made from), what it made and how long it
took. A step whose record names the same inputs and whose output exists is skipped; any other state of a
step (no record, other inputs, a leftover `.partial`) makes it run again from the start.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

log = logging.getLogger(__name__)


class FetchError(Exception):
    """A fetch that cannot go on; the message is the one line the command prints (exit code 2)."""


def free_bytes(where: Path) -> int:
    """Free bytes on the filesystem that holds `where` (or would: its nearest existing folder)."""
    where = Path(where).absolute()
    while not where.exists():
        where = where.parent
    return shutil.disk_usage(where).free


def disk_full(what: str, need: int, where: Path) -> FetchError:
    free = free_bytes(where)
    return FetchError(
        f"disk full: {what} needs about {need / 1e9:.1f} GB free in {where} ({free / 1e9:.1f} GB free now); "
        "free some space and run again to continue"
    )


@dataclass(frozen=True, slots=True)
class Step:
    name: str  # what it does, for people: "assemble", "convert", "export weight-only"
    output: Path
    inputs: dict  # the identity of what it is made from; the done record is keyed by it
    make: Callable[[Path], dict]  # writes the output at the path it is given; returns facts for the record
    space_needed: int  # bytes, about: said when the disk fills
    after: Callable[[], None] = field(default=lambda: None)  # runs once the record is written


def remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def size_of(path: Path) -> int:
    if path.is_dir():
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return path.stat().st_size if path.exists() else 0


class Records:
    """The done records of one fetch directory."""

    def __init__(self, root: Path):
        self.root = root
        self.folder = root / "done"

    def path(self, output: Path) -> Path:
        return self.folder / f"{output.name}.json"

    def read(self, output: Path) -> dict | None:
        try:
            return json.loads(self.path(output).read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None

    def is_done(self, step: Step) -> bool:
        """The record names the step's inputs, and its output is there (a file: of the size it was made)."""
        record = self.read(step.output)
        if record is None or record.get("inputs") != step.inputs or not step.output.exists():
            return False
        size = record.get("made", {}).get("size")
        return step.output.is_dir() or size is None or step.output.stat().st_size == size

    def write(self, step: Step, made: dict, seconds: float) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        record = {
            "step": step.name,
            "output": step.output.name,
            "inputs": step.inputs,
            "made": made,
            "seconds": round(seconds, 1),
            "finished": datetime.now(UTC).isoformat(timespec="seconds"),
        }
        partial = self.path(step.output).with_suffix(".json.partial")
        partial.write_text(json.dumps(record, indent=2) + "\n")
        os.replace(partial, self.path(step.output))

    def clear(self, output: Path) -> None:
        self.path(output).unlink(missing_ok=True)


def run_step(step: Step, records: Records) -> bool:
    """Run `step` unless its record says it is done; True when it ran."""
    if records.is_done(step):
        log.info("%s %s: done before, skipped", step.name, step.output.name)
        return False
    records.clear(step.output)
    partial = step.output.with_name(step.output.name + ".partial")
    remove(partial)
    start = time.monotonic()
    try:
        made = step.make(partial)
        remove(step.output)
        os.replace(partial, step.output)
    except OSError as error:
        remove(partial)
        if error.errno == errno.ENOSPC:
            raise disk_full(f"{step.name} {step.output.name}", step.space_needed, records.root) from None
        raise
    except BaseException:
        remove(partial)
        raise
    seconds = time.monotonic() - start
    records.write(step, made, seconds)
    log.info("%s %s: %.1f MB in %.1f s", step.name, step.output.name, size_of(step.output) / 1e6, seconds)
    step.after()
    return True
