"""The adaptation cycle (drafter/adaptation/cycle.py) on a real engine: a drafter fine-tuned on what a target
emitted is swapped in only when it scores better on held-out traffic, then drafts exactly what transformers
drafts on the saved version; a candidate no better is never swapped in; a rollback restores the previous
version's drafts exactly; and a waiting request stops the work between two steps."""

from __future__ import annotations

import pytest
import torch

from drafter.adaptation.buffer import TrafficBuffer
from drafter.adaptation.cycle import SCORE, Cycle
from drafter.adaptation.settings import CycleSettings
from drafter.adaptation.weights import source_hf_config, source_tensors
from engine.config import EngineConfig
from engine.engine import Engine
from engine.requests import DraftRequest
from export.versions import version_config, write_version
from tests.oracle import hf_greedy, make_hf_model

CONFIG = EngineConfig(max_seq_len=256, max_batch_size=2, max_draft_tokens=8, dtype="float32")
K = 4


def perturbed_copy(name: str):
    """The target `name` with every weight moved by noise; it agrees with the target on about a fifth of
    its tokens (teacher-forced, on the traffic below)."""
    drafter = make_hf_model(name, seed=0)
    generator = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for parameter in drafter.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * parameter.std() * 0.15)
    return drafter


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    """(name, export mode or None) -> (target, directory the drafter is served from, the drafter as
    transformers runs it: for an FP8 export, compressed-tensors' own decompression of it)."""
    made = {}

    def get(name: str = "gqa2-untied", mode: str | None = None):
        if (name, mode) not in made:
            drafter = perturbed_copy(name)
            directory = tmp_path_factory.mktemp("drafter")
            drafter.save_pretrained(directory)
            if mode is not None:
                from export.__main__ import run_export

                run_export(str(directory), directory.parent / f"{directory.name}-{mode}", mode)
                directory = directory.parent / f"{directory.name}-{mode}"
                drafter = oracle(directory, quantized=True)
            made[name, mode] = (make_hf_model(name, seed=0), directory, drafter)
        return made[name, mode]

    return get


@pytest.fixture(scope="module")
def pair(pairs):
    return pairs()


def traffic(target, num_sessions: int = 24, length: int = 48, buffer=None, seed: int = 5) -> TrafficBuffer:
    """What the target emits for a few prompts many conversations share, fed as rounds of k = 4."""
    buffer = buffer or TrafficBuffer(max_tokens=100_000, context_window=16, held_out_every=4)
    generator = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(0, 512, (20,), generator=generator).tolist() for _ in range(3)]
    outputs = [hf_greedy(target, prompt, length) for prompt in prompts]
    for session in range(num_sessions):
        prompt, output = prompts[session % 3], outputs[session % 3]
        context = prompt + output
        for start in range(0, length, K):  # each round: K - 1 kept drafts and the target's own token
            buffer.add(f"s{session}", torch.tensor(context).numpy(), len(prompt) + start, K - 1, K)
    return buffer


def cycle_for(engine: Engine, buffer: TrafficBuffer, **settings) -> Cycle:
    loaded = engine.loaded
    return Cycle(
        CycleSettings(**settings),
        buffer,
        source_hf_config(loaded),
        source_tensors(loaded, torch.float32),
        loaded.quantization,
        torch.float32,
        engine.weight_swap,
    )


def run_until_decided(cycle: Cycle, limit: int = 50) -> str:
    for _ in range(limit):
        decision = cycle.work(lambda: False)
        if decision is not None:
            return decision
    raise AssertionError("no decision")


def live_oracle(cycle: Cycle, engine: Engine, directory):
    """transformers' model of the live version, saved as `--adapt-dir` saves it."""
    quantization = engine.loaded.quantization
    hf_config = source_hf_config(engine.loaded)
    write_version(directory, cycle.live.tensors, version_config(hf_config, quantization, torch.float32))
    return oracle(directory, quantized=quantization != "none")


def oracle(directory, quantized: bool = False):
    from transformers import AutoModelForCausalLM, CompressedTensorsConfig

    options = {"quantization_config": CompressedTensorsConfig(run_compressed=False)} if quantized else {}
    return AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32, **options).eval()


@pytest.mark.filterwarnings("ignore:You passed `quantization_config`:UserWarning")
@pytest.mark.parametrize(
    ("name", "mode", "rank"),
    [
        ("gqa2-untied", None, 0),
        ("qwen2-gqa2-tied", None, 0),
        ("gqa2-untied", "weight-only", 0),
        ("gqa2-untied", None, 8),
    ],
)
def test_a_better_candidate_is_swapped_in_and_drafts_as_its_saved_version(
    name, mode, rank, pairs, tmp_path, one_thread
):
    """Qwen3 and Qwen2 (biases), unquantized and FP8 weight-only (the candidate quantized by the export's
    code, the saved version read back by compressed-tensors), every decoder weight trained or low-rank
    adapters (`--adapt-rank`: the version is their merged weights)."""
    target, directory, drafter = pairs(name, mode)
    engine = Engine.load(str(directory), CONFIG)
    buffer = traffic(target)
    # A tiny random-weight drafter learns at larger steps than a real one (drafter/adaptation/settings.py).
    cycle = cycle_for(
        engine,
        buffer,
        steps_per_candidate=40,
        step_tokens=64,
        learning_rate=3e-3 if rank else 1e-3,
        adapter_rank=rank,
    )
    assert cycle.has_work()
    assert run_until_decided(cycle) == "swapped"
    described = cycle.describe()
    assert described["version"] == 1 and described["swaps"] == 1 and engine.weights_version == 1
    assert described["swap_seconds"] > 0
    scores = described["last_candidate"]
    assert scores["candidate"]["tokens_per_round"] > scores["live"]["tokens_per_round"] * 1.02

    version_1 = live_oracle(cycle, engine, tmp_path / "v1")
    generator = torch.Generator().manual_seed(9)
    contexts = [torch.randint(0, 512, (n,), generator=generator).tolist() for n in (6, 30)]
    contexts.append(buffer.held_out[0].tokens[:30])  # traffic it was scored on: it learned the target here
    assert [engine.draft(c, K) for c in contexts] == [hf_greedy(version_1, c, K) for c in contexts]
    assert [engine.draft(c, K) for c in contexts] != [hf_greedy(drafter, c, K) for c in contexts]

    # Rollback: after the swap the traffic turns to what version 0 drafts itself (its own greedy output),
    # where version 1 does worse. Version 1 served its rounds and is judged on that traffic: version 0 again.
    traffic(drafter, num_sessions=12, buffer=buffer, seed=6)
    for _ in range(cycle.settings.rollback_rounds):
        cycle.observe(1, 1, K)
    assert cycle.has_work() and run_until_decided(cycle) == "rolled back"
    judged = cycle.describe()["last_judgment"]
    assert (
        judged["version"] == 1 and judged["before"]["tokens_per_round"] > judged["live"]["tokens_per_round"]
    )
    assert cycle.describe()["version"] == 0 and cycle.describe()["rollbacks"] == 1
    assert cycle.describe()["swap_seconds"] > described["swap_seconds"]  # the rollback's swap counts too
    assert [engine.draft(c, K) for c in contexts] == [hf_greedy(drafter, c, K) for c in contexts]


def test_a_swapped_version_as_good_on_the_traffic_after_its_swap_is_kept_however_its_live_rounds_compare(
    pair, one_thread
):
    """Version 1's live rounds fall far short of version 0's (harder prompts came later), but replayed on the
    same traffic since the swap it is the better one: it stays."""
    target, directory, _ = pair
    engine = Engine.load(str(directory), CONFIG)
    buffer = traffic(target)
    cycle = cycle_for(engine, buffer, steps_per_candidate=40, learning_rate=1e-3, step_tokens=64)
    assert run_until_decided(cycle) == "swapped"
    for _ in range(cycle.settings.rollback_rounds):
        cycle.observe(0, 3, K)  # what version 0 got before the swap: 4 tokens a round
        cycle.observe(1, 0, K)  # version 1's live rounds: 1 token each
    assert cycle.judgment_due
    assert cycle.work(lambda: False) is None  # no traffic since the swap yet: judged later
    assert not cycle.judgment_due and cycle.judge_at == 2 * cycle.settings.rollback_rounds
    traffic(target, num_sessions=12, buffer=buffer, seed=6)
    for _ in range(cycle.settings.rollback_rounds):
        cycle.observe(1, 0, K)
    assert run_until_decided(cycle) == "kept"
    assert cycle.describe()["version"] == 1 and cycle.describe()["rollbacks"] == 0


def test_a_candidate_no_better_is_never_swapped_in(pair, one_thread):
    target, directory, drafter = pair
    engine = Engine.load(str(directory), CONFIG)
    prompt = list(range(40))
    before = engine.draft(prompt, K)
    cycle = cycle_for(engine, traffic(target), steps_per_candidate=4, learning_rate=0.0)  # the live weights
    assert run_until_decided(cycle) == "rejected"
    last = cycle.describe()["last_candidate"]
    assert last["candidate"] == last["live"] and last["swapped"] is False
    cycle = cycle_for(engine, traffic(target), steps_per_candidate=4, learning_rate=3.0)  # wrecked weights
    assert run_until_decided(cycle) == "rejected"
    assert engine.weights_version == 0 and engine.draft(prompt, K) == before == hf_greedy(drafter, prompt, K)


def test_work_stops_for_a_request_between_steps_and_inside_one(pair, one_thread):
    target, directory, _ = pair
    engine = Engine.load(str(directory), CONFIG)
    cycle = cycle_for(engine, traffic(target), steps_per_candidate=8)
    assert cycle.work(lambda: True) is None and cycle.counters.training_steps == 0
    assert cycle.work(lambda: cycle.counters.training_steps >= 3) is None
    assert cycle.counters.training_steps == 3 and engine.weights_version == 0

    # A request arriving inside a step, before its second decoder layer's forward, then before its first
    # chunk of logits: the step is dropped and no weight moves.
    before = cycle.trainer.state()
    num_layers = len(cycle.trainer.model.model.layers)
    for cut_at in (3, num_layers + 2):  # stop() is asked by the loop, then before each layer's forward,
        stop, asked = stopping_at(cut_at)  # each chunk of logits and each layer's backward
        assert cycle.work(stop) is None and len(asked) == cut_at
        assert cycle.counters.training_steps == 3
        assert all(torch.equal(before[name], tensor) for name, tensor in cycle.trainer.state().items())
    assert cycle.work(lambda: cycle.counters.training_steps >= 4) is None  # and it goes on from there


def test_a_candidate_is_made_and_loaded_for_scoring_a_tensor_at_a_time_and_scores_as_if_made_whole(
    pair, one_thread
):
    """Merging and quantizing a candidate, and loading a version into the scorer, took seconds on the real
    drafter and a request could not cut them short: here a request comes after every tensor, and the round
    still decides as one that nothing interrupted."""
    target, directory, _ = pair
    whole = cycle_for(Engine.load(str(directory), CONFIG), traffic(target), steps_per_candidate=2)
    decision = run_until_decided(whole)
    cycle = cycle_for(Engine.load(str(directory), CONFIG), traffic(target), steps_per_candidate=2)
    assert cycle.work(lambda: cycle.phase == SCORE) is None  # trained; the candidate's making not begun
    num_tensors = len(whole.live.tensors)
    returns = 0
    while cycle.making is not None or cycle.contest.holds is not cycle.candidate:
        stop, _ = stopping_at(2)  # the loop asks once, one piece of work, then it asks again
        assert cycle.work(stop) is None
        returns += 1
        assert returns <= 3 * num_tensors
    # What training leaves as it was (here the embedding and the untied head) is the live version's own
    # tensors: neither made nor loaded again (nor copied at a swap). Each other tensor is made, then loaded
    # into the scorer: one a return.
    shared = {name for name, tensor in cycle.candidate.tensors.items() if tensor is cycle.live.tensors[name]}
    assert shared == {"model.embed_tokens.weight", "lm_head.weight"}
    assert returns >= 2 * (num_tensors - len(shared))
    assert cycle.counters.making_s > 0 and cycle.counters.scoring_s > 0
    assert run_until_decided(cycle) == decision
    assert cycle.describe()["last_candidate"] == whole.describe()["last_candidate"]


def test_a_swap_is_made_between_requests_a_piece_at_a_time_and_goes_in_at_once(pairs, tmp_path, one_thread):
    """Packing the new weights took ~1.1 s of a real drafter's swap: it is made beside the live weights a
    module at a time, a request after every piece served by the old weights from their cache, and only the
    commit (plain copies, packed linears rebound) holds a request up."""
    target, directory, drafter = pairs("gqa2-untied")
    engine = Engine.load(str(directory), CONFIG)
    cycle = cycle_for(engine, traffic(target), steps_per_candidate=40, step_tokens=64, learning_rate=1e-3)
    swapping = lambda: cycle.making is not None and cycle.making[0] == "swap_s"  # noqa: E731
    for _ in range(50):
        if cycle.work(swapping) is None and swapping():
            break
    prompt = traffic(target).held_out[0].tokens[:30]
    before = engine.draft(prompt, K, session="s")
    decision, old_weights = None, 0
    while decision is None:
        stop, _ = stopping_at(2)  # one piece of work, then a request
        decision = cycle.work(stop)
        if engine.weights_version == 0:
            again = engine.draft_batch([DraftRequest(prompt, K, "s")])[0]
            assert again.tokens == before and again.cached > 0
            old_weights += 1
    assert decision == "swapped" and engine.weights_version == 1
    assert old_weights > len(cycle.live.tensors) // 3  # a module's tensors a piece
    described = cycle.describe()
    assert 0 < described["swap_commit_seconds"] < described["swap_seconds"]
    assert engine.draft(prompt, K) == hf_greedy(live_oracle(cycle, engine, tmp_path / "v1"), prompt, K)


def test_a_round_is_work_to_do_from_before_its_first_step_until_its_decision(pair, one_thread):
    # /info's "busy" and the server's next post both ask `has_work`: inside a round's first step, and after
    # that step is cut short for a request, the round is still to do.
    target, directory, _ = pair
    cycle = cycle_for(Engine.load(str(directory), CONFIG), traffic(target), steps_per_candidate=2)
    assert cycle.has_work()
    inside = []
    stop, asked = stopping_at(3)

    def stop_and_look() -> bool:
        inside.append(cycle.has_work())
        return stop()

    assert cycle.work(stop_and_look) is None and cycle.counters.training_steps == 0
    assert inside == [True] * len(asked) and cycle.has_work()
    run_until_decided(cycle)
    assert not cycle.has_work()  # no target tokens came in since the round began


def stopping_at(num_calls: int):
    """A stop() that turns true at its `num_calls`-th call, and the list of its calls."""
    asked = []

    def stop() -> bool:
        asked.append(1)
        return len(asked) >= num_calls

    return stop, asked


def test_training_waits_out_the_targets_longest_round_before_it_takes_the_engine():
    """Between two calls of a conversation the engine idles while the target verifies; work there takes the
    target's cores. A GPU target's 25 ms round keeps the 50 ms spell. On the real pair's CPU the target was
    told a 404 ms plain step and took 1.4 s between calls at k = 4: the spell must outlast those gaps."""
    from drafter.server.adapt_work import QUIET_S, longest_round_ms, quiet_spell_s
    from drafter.sessions.target_cost import TargetCost

    assert quiet_spell_s(0.0) == quiet_spell_s(25.0) == QUIET_S
    target = TargetCost(told_step_ms=404.0, told_token_ms=20.0, max_drafts=8)
    assert quiet_spell_s(longest_round_ms(target)) == pytest.approx(0.808)  # told, before any gap
    for gap_ms in (1400.0, 1500.0, 1450.0):
        target.observe(num_drafts=4, gap_ms=gap_ms)
        target.observe(num_drafts=1, gap_ms=600.0)
    assert quiet_spell_s(longest_round_ms(target)) == pytest.approx(2.9)  # twice the k = 4 rounds' median
