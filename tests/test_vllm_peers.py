"""The peer table's arithmetic and rendering (bench/vllm_target/peers.py, peer_table.py, peer_modes.py), on
made-up runs: no vLLM, no weights. The table itself runs vLLM (bench/README.md); these check what it derives."""

from __future__ import annotations

import pytest

from bench.harness.projection import GpuModel
from bench.vllm_target.peer_modes import MODES, TargetCosts, auto_flags, server_args
from bench.vllm_target.peer_table import projected_speedup, run_row, table
from bench.vllm_target.peers import engine_groups, target_costs


def run(outputs, seconds, drafts=0, draft_tokens=0, accepted=0, proposer=None) -> dict:
    spec = {"num_drafts": drafts, "num_draft_tokens": draft_tokens, "num_accepted_tokens": accepted}
    answer = {"outputs": outputs, "seconds": seconds, "spec": spec}
    if proposer is not None:
        answer["proposer"] = proposer
    return answer


def test_target_costs_step_per_decode_step_and_slope_over_rows():
    alone = {  # the longest row sets a run's decode steps; rows that end early do not shorten it
        1: {"code": run_row(run([[1] * 10], 1.0)), "prose": run_row(run([[1] * 30], 3.0))},
        4: {"code": run_row(run([[1] * 20, [1] * 5, [1] * 3, [1] * 8], 4.0))},
    }
    costs = target_costs(alone)
    assert costs[1].step_ms == pytest.approx(100.0)
    assert costs[4].step_ms == pytest.approx(200.0)
    assert costs[1].per_token_ms == costs[4].per_token_ms == pytest.approx(100.0 / 3)


def test_target_costs_without_a_second_concurrency_has_no_slope():
    costs = target_costs({8: {"code": run_row(run([[1] * 16] * 8, 1.6))}})
    assert costs[8] == TargetCosts(step_ms=pytest.approx(100.0), per_token_ms=None)


def test_auto_mode_tells_the_server_the_target_costs_and_fixed_modes_do_not():
    costs = TargetCosts(step_ms=512.25, per_token_ms=80.5)
    assert server_args(MODES["drafter-fp8"], 4, costs) == ["--draft-source=model", "--max-draft-tokens=4"]
    assert server_args(MODES["drafter-fp8-hybrid"], 4, None)[0] == "--draft-source=hybrid"
    assert server_args(MODES["drafter-fp8-auto"], 4, costs)[2:] == auto_flags(costs)
    assert auto_flags(costs) == ["--target-verify-ms=512.250", "--target-verify-ms-per-token=80.500"]
    assert auto_flags(TargetCosts(512.25, None)) == ["--target-verify-ms=512.250"]
    with pytest.raises(ValueError, match="alone"):
        server_args(MODES["drafter-fp8-auto"], 4, None)


def test_modes_set_up_alike_share_an_engine_in_the_order_given():
    names = ["alone", "drafter-fp8", "ngram", "drafter-fp8-auto", "drafter-fp8-hybrid", "drafter-bf16"]
    groups = [[mode.name for mode in group] for group in engine_groups([MODES[name] for name in names])]
    assert groups == [
        ["alone"],
        ["drafter-fp8", "drafter-fp8-hybrid", "drafter-bf16"],
        ["ngram"],
        ["drafter-fp8-auto"],
    ]


def test_projection_charges_steps_a_drafter_answered_with_no_drafts():
    gpu = GpuModel(verify_ms=5.0, draft_step_ms=0.2, draft_overhead_ms=0.25)
    proposer = {"num_calls": 10, "propose_s": 0.5, "skipped": {}}
    every_step = run_row(run([[1] * 40], 1.0, drafts=10, draft_tokens=40, accepted=30, proposer=proposer))
    # every step drafted: 1 + accepted / drafts tokens for a verify, the call and 4 draft steps
    expected = (1 + 30 / 10) * 5.0 / (5.0 + 0.25 + 4 * 0.2)
    assert projected_speedup("drafter-fp8", every_step, gpu, 1.6) == pytest.approx(expected)
    half = run_row(
        run([[1] * 40], 1.0, drafts=10, draft_tokens=40, accepted=30, proposer={**proposer, "num_calls": 20})
    )
    assert half["num_undrafted_calls"] == 10
    assert projected_speedup("drafter-fp8", half, gpu, 1.6) == pytest.approx(
        50 * 5.0 / (20 * 5.25 + 40 * 0.2)
    )
    # vLLM's own methods: no HTTP; draft_model's drafts read bf16 weights, ngram's none
    in_process = run_row(run([[1] * 40], 1.0, drafts=10, draft_tokens=40, accepted=30))
    assert projected_speedup("draft_model", in_process, gpu, 1.6) == pytest.approx(
        40 * 5.0 / (50.0 + 40 * 0.32)
    )
    assert projected_speedup("ngram", in_process, gpu, 1.6) == pytest.approx(4.0)
    assert projected_speedup("alone", in_process, gpu, 1.6) == 1.0


def test_table_lines_per_workload_concurrency_and_mode_with_ratio_and_lossless():
    alone = {c: {"code": run_row(run([[1, 2, 3]] * c, 1.0))} for c in (1, 4)}
    drafter = {
        1: {"code": run_row(run([[1, 2, 3]], 0.5, drafts=1, draft_tokens=4, accepted=2))},
        4: {"code": run_row(run([[1, 2, 3]] * 3 + [[1, 2, 4]], 2.0, drafts=4, draft_tokens=16, accepted=8))},
    }
    results = {"alone": alone, "drafter-fp8": drafter, "ngram": {"error": "vLLM target exited"}}
    lines = table(results, ["code"], [1, 4], GpuModel(), 1.6).splitlines()
    assert lines[2].startswith("| code | 1 | alone | 3.0 | 1.00x | 1.00 |  | 1.00x | yes |")
    assert lines[3].startswith("| code | 1 | drafter-fp8 | 6.0 | 2.00x | 3.00 |")
    assert lines[3].endswith("| yes |")
    assert lines[4] == "| code | 1 | ngram | failed: vLLM target exited | | | | | |"
    assert lines[6].startswith("| code | 4 | drafter-fp8 | 6.0 | 0.50x | 3.00 |")
    assert lines[6].endswith("| NO |")
    assert len(lines) == 2 + 2 * 3
