"""The verify floor of bench/ahead.py: on the CPU the target and the drafter share the machine's cores, so
ahead work slows the target's verify pass; and the target verifies faster than the drafter's ahead loop
runs, so the server rightly drafts nothing ahead (too_slow). The projection assumes, as a GPU with the
drafter beside the target would roughly give, that ahead work overlaps the verify at no cost to it (an upper
bound: both read the same memory bus).

`--verify-floor-ms X` makes every verify pass last at least X ms, the rest spent asleep (the CPU idle, as
when the target verifies on a GPU), to measure the hit rate the prediction itself reaches when branches are
ready in time. X should be a GPU's ratio of verify to draft step times the server's ahead step_ms: `auto`
takes the ratio from the pair's GPU model (bench/harness/gpu_floors.py: for the real pair an H100's
Qwen2.5-Coder-1.5B bf16 verify over its 0.5B FP8 draft step, 0.92 / 0.19 ms, 4.9; for the testbed Qwen3-8B
over Qwen3-0.6B, 22) and the step from a calibration before the workloads: a server drafting ahead, a
random prompt decoded with every verify lasting CALIBRATION_FLOOR_MS (the CPU left to its loops), /info's
step_ms. A list (the real pair's default `0,auto`) runs both server settings once per floor.
"""

from __future__ import annotations

import contextlib
import sys
import time

from bench.ahead_args import AUTO_FLOOR
from bench.harness.decoding import DRAFT_TIMEOUT_S, speculative_greedy, started_server
from bench.harness.prompts import BenchError
from drafter.client import DraftClient
from drafter.integrations.transformers_generate import SpeculationStats
from drafter.sessions.draft_source import MODEL

# A fresh server's warm-up needs a few rounds, not a whole answer; the floor's calibration a few more, for the
# server's moving average of its ahead step to outgrow its first loop.
WARMUP_NEW_TOKENS, CALIBRATION_NEW_TOKENS = 8, 16
CALIBRATION_FLOOR_MS = 2000.0  # a verify long enough for an ahead loop of the real pair's k on an idle CPU


@contextlib.contextmanager
def verify_floor(model, floor_ms: float):
    """Every forward pass of `model` lasts at least `floor_ms`, asleep for the rest (the CPU left idle)."""
    forward = model.forward

    def floored(*args, **kwargs):
        began = time.perf_counter()
        out = forward(*args, **kwargs)
        time.sleep(max(0.0, floor_ms / 1e3 - (time.perf_counter() - began)))
        return out

    if floor_ms > 0:
        model.forward = floored
    try:
        yield
    finally:
        if floor_ms > 0:
            del model.forward  # the class's own again


@contextlib.contextmanager
def warm_server(args, model, flags, warmup: list[int], floor_ms: float, new_tokens: int = WARMUP_NEW_TOKENS):
    """A client of a fresh server with these flags, after an untimed decode of `new_tokens` after `warmup` (a
    fresh server's first calls), with every verify of the target lasting at least `floor_ms` throughout."""
    with (
        started_server(flags) as url,
        DraftClient(url, timeout_s=DRAFT_TIMEOUT_S) as client,
        verify_floor(model, floor_ms),
    ):
        speculative_greedy(model, client, warmup, new_tokens, SpeculationStats(args.k), False, MODEL)
        yield client


def ahead_step_ms(args, model, flags: list[str], warmup: list[int]) -> float:
    """The server's ahead step time (/info's step_ms) with the CPU idle while the target verifies: a server
    drafting ahead, warmed with every verify lasting CALIBRATION_FLOOR_MS."""
    flags = [*flags, f"--draft-ahead={args.branches}"]
    with warm_server(args, model, flags, warmup, CALIBRATION_FLOOR_MS, CALIBRATION_NEW_TOKENS) as client:
        step_ms = client.info().get("draft_ahead", {}).get("step_ms")
    if step_ms is None:
        raise BenchError(
            "calibrating --verify-floor-ms auto, the server drafted nothing ahead: give it in ms"
        )
    return step_ms


def settled_floors(args, model, flags, warmup) -> list[dict]:
    """Each --verify-floor-ms as {"ms", "basis"}: `auto` the GPU's verify / draft step ratio times the
    calibrated ahead step."""
    if AUTO_FLOOR not in args.verify_floor_ms:
        return [{"ms": ms, "basis": "given"} for ms in args.verify_floor_ms]
    step_ms, gpu = ahead_step_ms(args, model, flags, warmup), args.gpu
    ratio = gpu.verify_ms / gpu.draft_step_ms
    auto = {
        "ms": ratio * step_ms,
        "basis": f"auto: {gpu.name}'s verify / draft step ({gpu.verify_ms:.3f} / {gpu.draft_step_ms:.3f} ms "
        f"= {ratio:.2f}) x the server's ahead step on an idle CPU ({step_ms:.1f} ms)",
    }
    print(f"verify floor {auto['basis']}: {auto['ms']:.0f} ms", file=sys.stderr)
    return [auto if ms == AUTO_FLOOR else {"ms": ms, "basis": "given"} for ms in args.verify_floor_ms]
