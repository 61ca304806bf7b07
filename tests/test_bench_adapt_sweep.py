"""bench/adapt/sweep.py on a tiny pair: a setting that does not learn scores exactly as version 0, and one
that learns the target's traffic scores better on it; its two ways of holding traffic out; the target's
outputs decoded in batches equal its one-at-a-time greedy outputs."""

from __future__ import annotations

import pytest
import torch

from bench.adapt.sweep import examples, markdown, parse_args, split, sweep
from bench.harness.decoding import target_greedy_batch
from export.versions import served_tensors
from tests.oracle import hf_greedy, make_hf_model


def test_a_setting_that_does_not_learn_scores_as_version_0_and_one_that_learns_scores_better(one_thread):
    name = "gqa2-untied"
    target = make_hf_model(name, seed=0)
    drafter = make_hf_model(name, seed=0)
    generator = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for (
            parameter
        ) in drafter.parameters():  # a drafter that agrees with the target about a fifth of the time
            parameter.add_(torch.randn(parameter.shape, generator=generator) * parameter.std() * 0.15)
    prompts = [
        {"name": f"p{i}", "tokens": torch.randint(0, 512, (20,), generator=generator).tolist()}
        for i in range(6)
    ]
    outputs = [hf_greedy(target, p["tokens"], 48) for p in prompts]
    hf_config = drafter.config.to_dict()
    v0 = served_tensors(drafter.state_dict(), "none", torch.float32, tied=False)
    result = sweep(
        hf_config,
        "none",
        torch.float32,
        v0,
        examples(prompts[:4], outputs[:4], 4, held_out=False),
        examples(prompts[4:], outputs[4:], 4, held_out=True),
        [(0, 0.0), (0, 1e-3)],
        steps=24,
        score_every=12,
    )
    still, learning = result["settings"]
    assert [p["step"] for p in still["points"]] == [12, 24]
    assert all(p["held_out_ratio"] == 1.0 and p["training_ratio"] == 1.0 for p in still["points"])
    assert learning["points"][-1]["training_ratio"] > 1.1
    assert "| 0 | 0.001 |" in markdown({"sweep": result, "config": {"k": 4}})


def test_held_out_traffic_is_other_prompts_or_the_later_half_of_each_output_after_its_first():
    prompts = [
        {"name": name, "tokens": [i, i + 1, i + 2]} for i, name in zip((0, 10, 20), "abc", strict=True)
    ]
    outputs = [[100, 101, 102, 103], [110, 111, 112], [120, 121]]
    training, held_out = split(prompts, outputs, 4, "modules")
    assert [e.session for e in training] == ["a", "b"] and [e.session for e in held_out] == ["c"]
    assert (
        held_out[0].tokens == [20, 21, 22, 120, 121] and held_out[0].num_context == 3 and held_out[0].held_out
    )

    training, held_out = split(prompts, outputs, 4, "halves")
    assert [e.tokens[e.num_context :] for e in training] == [[100, 101], [110], [120]]
    assert [e.tokens[e.num_context :] for e in held_out] == [[102, 103], [111, 112], [121]]
    assert held_out[0].tokens[: held_out[0].num_context] == [0, 1, 2, 100, 101]  # the first half is context
    assert not any(e.held_out for e in training) and all(
        e.held_out and e.num_draft_tokens == 4 for e in held_out
    )


@pytest.mark.parametrize("name", ["gqa2-untied", "qwen2-gqa4-untied-odd"])
def test_a_batch_of_prompts_of_other_lengths_decodes_as_each_prompt_alone(name, one_thread):
    target = make_hf_model(name, seed=3)
    generator = torch.Generator().manual_seed(5)
    prompts = [torch.randint(1, 512, (n,), generator=generator).tolist() for n in (9, 23, 4, 16, 11)]
    alone = [hf_greedy(target, prompt, 24) for prompt in prompts]
    assert target_greedy_batch(target, prompts, 24) == alone


@pytest.mark.parametrize(
    "flags", [["--target-batch", "0"], ["--prompts", "2"], ["--settings", "8:-1e-4"], ["--split", "thirds"]]
)
def test_bad_flag_values_are_refused_before_any_work(flags, capsys):
    with pytest.raises(SystemExit) as exit:
        parse_args(flags)
    assert exit.value.code == 2 and "error:" in capsys.readouterr().err
