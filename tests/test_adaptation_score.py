"""The scorer (drafter/adaptation/score.py): tokens per round replayed from teacher-forced agreement equal
those of actually drafting greedily with transformers round by round against the target's tokens."""

from __future__ import annotations

import pytest
import torch

from drafter.adaptation.buffer import Example
from drafter.adaptation.score import agreed_positions, replay, score
from tests.oracle import hf_greedy, make_hf_model


def test_replay_by_hand():
    agree = [True, True, False, True, True, True, True, False]
    assert replay(agree, 2) == (8, 3)  # rounds keep 2, 2, 1 drafts: 3 + 3 + 2 tokens
    assert replay(agree, 8) == (8, 2)  # keep 2, then 4: the target says the last token itself
    assert replay([], 4) == (0, 0)
    assert replay([False] * 5, 4) == (5, 5)  # every round: the target's token alone
    assert replay([True] * 5, 4) == (5, 1)  # 4 kept, then the target's token; the rest is not closed


def greedy_rounds(model, example: Example) -> tuple[int, int]:
    """What a target gets from the drafter drafting greedily with transformers, round by round."""
    context, targets, k = (
        example.tokens[: example.num_context],
        example.tokens[example.num_context :],
        example.num_draft_tokens,
    )
    tokens = rounds = start = 0
    while True:
        drafts = hf_greedy(model, context + targets[:start], k)
        kept = 0
        while kept < k and start + kept < len(targets) and drafts[kept] == targets[start + kept]:
            kept += 1
        if start + kept >= len(targets):
            return tokens, rounds
        tokens, rounds, start = tokens + kept + 1, rounds + 1, start + kept + 1


def partly_greedy(model, prompt: list[int], length: int, generator) -> list[int]:
    """A target that mostly continues as `model` would, with every few tokens its own."""
    out = []
    while len(out) < length:
        run = int(torch.randint(0, 7, (1,), generator=generator))
        out += hf_greedy(model, prompt + out, run) if run else []
        out.append(int(torch.randint(0, model.config.vocab_size, (1,), generator=generator)))
    return out[:length]


@pytest.mark.parametrize("name", ["gqa2-untied", "qwen2-gqa2-tied"])
def test_score_equals_drafting_round_by_round(name, one_thread):
    model = make_hf_model(name)
    generator = torch.Generator().manual_seed(3)
    examples = []
    for k, length in ((1, 20), (3, 40), (5, 33), (8, 50)):
        prompt = torch.randint(0, model.config.vocab_size, (12,), generator=generator).tolist()
        examples.append(Example("s", prompt + partly_greedy(model, prompt, length, generator), 12, k, False))
    expected = [greedy_rounds(model, example) for example in examples]
    scored = score(model, examples)
    assert (scored.tokens, scored.rounds) == tuple(map(sum, zip(*expected, strict=True)))
    assert 1.5 < scored.tokens_per_round < 5  # the examples have runs of agreement: the test means something
    assert scored.positions == 20 + 40 + 33 + 50


def test_agreement_makes_every_tensor_on_the_scorer_s_device():
    """A scorer on another device than the CPU (meta here, CUDA on a GPU) is fed its own device's ids: a
    check on the model's input fails on ids made on the CPU, as they once were (adaptation on CUDA then
    stopped at its first contest)."""
    model = make_hf_model("qwen2-gqa2-tied").to("meta")
    seen = []

    def same_device(module, args, kwargs):
        seen.append(kwargs["input_ids"].device)
        assert kwargs["input_ids"].device == model.lm_head.weight.device, "ids made off the model's device"

    model.model.register_forward_pre_hook(same_device, with_kwargs=True)
    example = Example("s", list(range(1, 30)), 12, 4, False)
    agreed = agreed_positions(model, example, lambda: False)
    assert seen == [torch.device("meta")] and agreed.device.type == "meta" and agreed.shape == (17,)
