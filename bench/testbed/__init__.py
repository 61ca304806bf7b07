"""The testbed: a small target/drafter pair trained here on real text (the standard library's code and its
reference docs), with held-out workloads (prose, code, edit), so that acceptance and speedup figures come
from models that agree and disagree the way a real pair does, not from random weights.

`python -m bench.testbed build` makes it (26 minutes on a 2-core AMD EPYC, seeded, offline); the result is
committed in bench/testbed/pair/ (about 16 MB) with a manifest of the recipe's key and every file's hash,
and the suite checks that the two match. Committed rather than cached, because every benchmark on every
machine needs the same pair, a rebuild costs 26 minutes, and a reviewer can then read the figures it gave.
"""

import json
from pathlib import Path

PAIR = Path(__file__).resolve().parent / "pair"  # the committed pair: target/, drafter/, exports, workloads/


def workload_tokens(name: str) -> list[list[int]]:
    """The token ids of each prompt of one committed workload (prose, code or edit)."""
    lines = (PAIR / "workloads" / f"{name}.jsonl").read_text().splitlines()
    return [json.loads(line)["tokens"] for line in lines if line.strip()]
