"""drafter/integrations/transformers_generate.py: transformers' `generate` with `custom_generate=speculative_decoding` equals the
target's own `generate`: greedy token for token (scripted drafters that are right, wrong at one position,
or ignorant of EOS; logits processors; real drafter servers of the target's weights and of their FP8
export), and with sampling, in distribution (a chi-square test against the exact target distribution)."""

from __future__ import annotations

import pytest
import torch

from drafter.client import DraftClient, Drafts
from drafter.integrations.transformers_generate import SpeculationStats, speculative_decoding
from tests.conftest import TARGET_MODEL
from tests.oracle import HF_CONFIGS, hf_greedy, make_hf_model

pytestmark = pytest.mark.usefixtures("one_thread")
VOCAB_SIZE = HF_CONFIGS[TARGET_MODEL]["vocab_size"]


class ScriptedDrafter:
    """Drafts `truth` (a continuation of `prompt`) from where the context has got to, with draft position
    `wrong_at`, if given, always wrong. Quacks like a DraftClient and its session."""

    def __init__(self, prompt: list[int], truth: list[int], wrong_at: int | None = None, auto_k: int = 6):
        self.prompt, self.truth, self.wrong_at, self.auto_k = prompt, truth, wrong_at, auto_k
        self.asked: list[int | str] = []

    def session(self):
        return self

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass

    def draft(self, context: list[int], k: int) -> Drafts:
        assert context[: len(self.prompt)] == self.prompt
        self.asked.append(k)
        drafts = self.truth[len(context) - len(self.prompt) :][: self.auto_k if k == "auto" else k]
        if self.wrong_at is not None and self.wrong_at < len(drafts):
            drafts[self.wrong_at] = (drafts[self.wrong_at] + 1) % VOCAB_SIZE
        return Drafts(tokens=drafts)


@pytest.fixture(scope="module")
def target(hf_checkpoint):
    model, _ = hf_checkpoint(TARGET_MODEL)
    return model


def generate(model, prompt: list[int], **kwargs) -> list[int]:
    ids = torch.tensor([prompt])
    return model.generate(ids, attention_mask=torch.ones_like(ids), **kwargs)[0, len(prompt) :].tolist()


def test_speculative_counts_rounds_and_positions(target):
    prompt = list(range(10, 30))
    truth = hf_greedy(target, prompt, 25)
    stats = SpeculationStats(num_draft_tokens=5)
    drafter = ScriptedDrafter(prompt, truth, wrong_at=3)
    # Draft 3 is always wrong, so every round keeps 3 drafts + the target's own token: 20 tokens in 5 rounds,
    # the last with k clipped to 3 (positions 3 and 4 drafted in only 4 rounds).
    out = generate(
        target,
        prompt,
        custom_generate=speculative_decoding,
        draft_client=drafter,
        num_draft_tokens=5,
        speculation_stats=stats,
        max_new_tokens=20,
        do_sample=False,
    )
    assert out == truth[:20]
    assert stats.num_rounds == 5 and stats.mean_accepted_tokens == 4
    assert stats.drafted == [5, 5, 5, 4, 4] and stats.accepted == [5, 5, 5, 0, 0]
    assert stats.acceptance_by_position == [1, 1, 1, 0, 0] and len(stats.draft_call_ms) == 5


def test_speculative_auto_lets_the_server_pick_k_and_drops_drafts_past_the_room(target):
    prompt = list(range(40, 60))
    truth = hf_greedy(target, prompt, 30)
    stats = SpeculationStats(num_draft_tokens="auto")
    drafter = ScriptedDrafter(prompt, truth, auto_k=6)
    out = generate(target, prompt, custom_generate=speculative_decoding, draft_client=drafter,
                   num_draft_tokens="auto", speculation_stats=stats, max_new_tokens=16, do_sample=False)  # fmt: skip
    # 6 drafts + 1 twice (14 tokens), then room for one draft: the server's other 5 are dropped.
    assert out == truth[:16] and drafter.asked == ["auto"] * 3
    assert [drafts for drafts, _, _ in stats.round_log] == [6, 6, 1] and stats.drafted == [3, 2, 2, 2, 2, 2]
    assert stats.acceptance_by_position == [1.0] * 6 and stats.mean_accepted_tokens == 16 / 3


@pytest.mark.parametrize("k", [0, -1, "eight", 2.0])
def test_speculative_refuses_a_bad_num_draft_tokens(target, k):
    with pytest.raises(ValueError, match="num_draft_tokens must be a positive integer or"):
        speculative_decoding(target, torch.tensor([[1, 2]]), draft_client=None, num_draft_tokens=k,
                             max_new_tokens=4, do_sample=False)  # fmt: skip


def test_speculative_plain_function_is_generate_with_custom_generate(target):
    prompt = list(range(100, 140))
    truth = hf_greedy(target, prompt, 30)
    ids = torch.tensor([prompt])
    out = speculative_decoding(target, ids, draft_client=ScriptedDrafter(prompt, truth, 2), max_new_tokens=30)
    assert out[0, :40].tolist() == prompt and out[0, 40:].tolist() == truth


@pytest.mark.parametrize("stop_at_eos", [False, True])
def test_speculative_eos_as_generate_treats_it(stop_at_eos):
    model = make_hf_model(TARGET_MODEL)  # its own copy: this test gives it an EOS token
    prompt = list(range(50, 90))
    truth = hf_greedy(model, prompt, 40)  # what a drafter that knows nothing of EOS drafts
    eos = model.generation_config.eos_token_id = truth[9]
    kwargs = dict(max_new_tokens=30, min_new_tokens=0 if stop_at_eos else 30, do_sample=False)
    drafter = ScriptedDrafter(prompt, truth)
    out = generate(model, prompt, custom_generate=speculative_decoding, draft_client=drafter, **kwargs)
    assert out == generate(model, prompt, **kwargs)
    if stop_at_eos:
        assert out == truth[: truth.index(eos) + 1]
    else:  # min_new_tokens masks EOS out of generate's argmax, and the verify pass does the same
        assert len(out) == 30 and eos not in out


def test_speculative_applies_generates_logits_processors(target):
    prompt = list(range(200, 230))
    kwargs = dict(max_new_tokens=40, do_sample=False, repetition_penalty=1.5, no_repeat_ngram_size=2)
    truth = generate(target, prompt, **kwargs)
    assert truth != hf_greedy(target, prompt, 40)  # the processors change the output: a real check
    for wrong_at in (None, 1):
        drafter = ScriptedDrafter(prompt, truth, wrong_at)
        assert (
            generate(target, prompt, custom_generate=speculative_decoding, draft_client=drafter, **kwargs)
            == truth
        )


def test_speculative_refuses_a_batch(target):
    ids = torch.tensor([[1, 2, 3], [4, 5, 6]])
    with pytest.raises(ValueError, match="one sequence at a time"):
        speculative_decoding(target, ids, draft_client=ScriptedDrafter([], []), max_new_tokens=4)


def test_speculative_refuses_drafts_outside_the_targets_vocabulary(target):
    prompt = list(range(5))
    drafter = ScriptedDrafter(prompt, [VOCAB_SIZE + 5] * 10)  # a drafter with a larger vocabulary
    with pytest.raises(ValueError, match="outside the target's vocabulary"):
        generate(target, prompt, custom_generate=speculative_decoding, draft_client=drafter, max_new_tokens=5)


def exact_distribution(model, prompt: list[int], num_tokens: int, temperature: float, top_k: int) -> dict:
    """{tuple of the next num_tokens tokens: probability} under temperature + top-k sampling, by enumeration."""
    dist = {(): 1.0}
    for _ in range(num_tokens):
        grown = {}
        for prefix, p in dist.items():
            with torch.no_grad():
                logits = model(torch.tensor([prompt + list(prefix)])).logits[0, -1] / temperature
            top = logits.topk(top_k)
            for token, q in zip(top.indices.tolist(), top.values.softmax(-1).tolist(), strict=True):
                grown[(*prefix, token)] = p * q
        dist = grown
    return dist


def chi_square_p_value(counts: dict, expected: dict, num_samples: int) -> float:
    """Pearson's test over outcomes expected at least 5 times, the rest lumped into one bin."""
    big = [o for o, p in expected.items() if p * num_samples >= 5]
    observed = [counts.get(o, 0) for o in big]
    wanted = [expected[o] * num_samples for o in big]
    observed.append(num_samples - sum(observed))
    wanted.append(num_samples - sum(wanted))
    stat = sum((o - e) ** 2 / e for o, e in zip(observed, wanted, strict=True) if e > 1e-9)
    dof = len(big) - (wanted[-1] <= 1e-9)
    return float(1 - torch.special.gammainc(torch.tensor(dof / 2), torch.tensor(stat / 2)))


def test_speculative_sampling_keeps_the_targets_distribution():
    model = make_hf_model("mha-tied")
    prompt = list(range(7, 27))
    temperature, top_k, num_samples = 1.5, 3, 600
    expected = exact_distribution(model, prompt, 3, temperature, top_k)
    # Propose the second likeliest first token, then its likeliest continuation, so rounds both accept and
    # reject (the residual path) often.
    marginal: dict = {}
    for outcome, p in expected.items():
        marginal[outcome[0]] = marginal.get(outcome[0], 0) + p
    second = sorted(marginal, key=marginal.get)[-2]
    first = max((o for o in expected if o[0] == second), key=expected.get)
    drafter = ScriptedDrafter(prompt, list(first))
    kwargs = dict(max_new_tokens=3, do_sample=True, temperature=temperature, top_k=top_k)
    torch.manual_seed(0)
    stats = SpeculationStats(2)
    counts: dict = {}
    for _ in range(num_samples):
        out = generate(
            model,
            prompt,
            custom_generate=speculative_decoding,
            draft_client=drafter,
            num_draft_tokens=2,
            speculation_stats=stats,
            **kwargs,
        )
        counts[tuple(out)] = counts.get(tuple(out), 0) + 1
    assert 0 < stats.accepted[0] < stats.drafted[0]  # both branches ran many times
    assert set(counts) <= set(expected)
    assert chi_square_p_value(counts, expected, num_samples) > 1e-3
    # The same test tells a wrong sampler apart: always keeping the proposal is far off.
    biased = dict(counts)
    biased[first] = biased.get(first, 0) + num_samples // 3
    assert chi_square_p_value(biased, expected, num_samples + num_samples // 3) < 1e-3


@pytest.mark.parametrize("drafter", ["same", "fp8"])
def test_generate_through_a_drafter_server_equals_greedy(target, target_drafters, drafter):
    generator = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, VOCAB_SIZE, (n,), generator=generator).tolist() for n in (1, 17, 90, 300)]
    stats = SpeculationStats(6)
    with DraftClient(target_drafters[drafter], timeout_s=30) as client:
        for prompt in prompts:
            out = generate(
                target,
                prompt,
                custom_generate=speculative_decoding,
                draft_client=client,
                num_draft_tokens=6,
                speculation_stats=stats,
                max_new_tokens=40,
                do_sample=False,
            )
            assert out == hf_greedy(target, prompt, 40)
    assert stats.num_skipped == 0 and stats.num_rounds < len(prompts) * 40 / 2
    if drafter == "same":  # the target's own weights: every draft is what the target would say
        assert stats.accepted == stats.drafted
    else:  # FP8 weights: close, not equal
        assert 0 < sum(stats.accepted) < sum(stats.drafted)


def test_generate_goes_on_alone_past_the_drafters_context(target, target_drafters):
    # The servers take 512 positions (context + drafts); the target keeps going past them, without drafts.
    prompt = torch.randint(0, VOCAB_SIZE, (490,), generator=torch.Generator().manual_seed(6)).tolist()
    stats = SpeculationStats(8)
    with DraftClient(target_drafters["same"], timeout_s=30) as client:
        out = generate(
            target,
            prompt,
            custom_generate=speculative_decoding,
            draft_client=client,
            speculation_stats=stats,
            max_new_tokens=40,
            do_sample=False,
        )
    assert out == hf_greedy(target, prompt, 40)
    # 490 + 9 + 9 = 508: room for 4 drafts, then none; the last 17 tokens come one per round, 16 of them
    # after a call the client answers at once with no drafts (the last round asks for none).
    assert stats.accepted == stats.drafted and sum(stats.accepted) == 8 + 8 + 4
    assert stats.num_skipped == 16 and stats.num_rounds == 3 + 17
