"""bench/adapt/preempt.py on the testbed's drafter: requests arrive during every kind of the cycle's work,
each one's wait is recorded by kind, and the cycle meanwhile trains and swaps as the server's would."""

from __future__ import annotations

import json

from bench.adapt.preempt import main
from bench.testbed import PAIR

KINDS = {"train", "score", "making_s", "scoring_s", "swap_s"}


def test_requests_meet_the_cycles_work_and_their_waits_are_reported(tmp_path, one_thread):
    argv = [
        "--model",
        str(PAIR / "drafter-fp8-weight-only"),
        "--tokenizer",
        str(PAIR / "target/tokenizer.json"),
    ]
    argv += [
        "--dtype",
        "float32",
        "--rank",
        "0",
        "--prompts",
        "10",
        "--seconds",
        "6",
        "--latest-arrival",
        "0.05",
        "--threads",
        "1",
    ]
    assert main([*argv, "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "report.json").read_text())
    waits, rows = report["waits"], {row["kind"]: row for row in report["summary"]}
    assert waits and {w["kind"] for w in waits} <= KINDS and all(w["wait_s"] >= 0 for w in waits)
    assert rows["all"]["n"] == len(waits) and "train" in rows  # steps are most of the work
    assert report["cycle"]["training_steps"] > 0 and report["cycle"]["swaps"] > 0  # every candidate goes in
    assert "| all |" in (tmp_path / "report.md").read_text()
