"""The score of a weights version on buffered traffic: the tokens per round a target would get from its
drafts, replayed exactly from one teacher-forced forward per example.

Greedy drafting from a true prefix produces the target's own tokens for exactly as long as the drafter's
greedy token agrees with the target's at each position given the true prefix before it (a draft that
matches leaves the context the teacher-forced one), so the drafts of a round starting at target position `s`
keep `a = min(run(s), k)` of its k tokens, `run(s)` being the agreements in a row from `s`. The target then
adds its own token, and the next round starts at `s + a + 1`. Rounds are replayed from each example's first
target token at the k its session drafted, and counted only when the target's token closing them is known
(a round running past the example's end is left out, for every version alike). The score is the emitted
tokens over the rounds: the figure speculative decoding's speed follows, where acceptance rates per token
would weight a long run of agreement like scattered ones.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from drafter.adaptation.buffer import Example
from drafter.adaptation.head import logits

SCORE_CHUNK = 64  # positions whose logits are computed at once (39 MB of them on a 152k vocabulary)


@dataclass(frozen=True, slots=True)
class Score:
    tokens: int  # emitted over the replayed rounds (kept drafts + the target's token each)
    rounds: int
    positions: int  # target tokens scored
    agreed: int  # of those, where the version's greedy token was the target's

    @property
    def tokens_per_round(self) -> float:
        return self.tokens / self.rounds if self.rounds else 0.0

    def describe(self) -> dict:
        return {
            "tokens_per_round": round(self.tokens_per_round, 4),
            "rounds": self.rounds,
            "agreement": round(self.agreed / self.positions, 4) if self.positions else None,
        }


def replay(agree: list[bool], num_draft_tokens: int) -> tuple[int, int]:
    """(emitted tokens, rounds) of the rounds at k = `num_draft_tokens` over target tokens whose
    teacher-forced agreement is `agree`."""
    runs = [0] * (len(agree) + 1)  # runs[i]: agreements in a row from i
    for i in range(len(agree) - 1, -1, -1):
        runs[i] = runs[i + 1] + 1 if agree[i] else 0
    tokens = rounds = start = 0
    while True:
        kept = min(runs[start], num_draft_tokens)
        if start + kept >= len(agree):  # the token that would close this round is not known
            return tokens, rounds
        tokens, rounds, start = tokens + kept + 1, rounds + 1, start + kept + 1


def agreement(model, example: Example, stop: Callable[[], bool] = lambda: False) -> list[bool]:
    """Per target token of `example`: whether `model`'s (a transformers causal LM's) greedy token given the
    true prefix before it is it. The lm_head runs SCORE_CHUNK positions at a time, a slice of the vocabulary
    at a time (drafter/adaptation/head.py), `stop()` asked between (inside `preemptible` its layers ask
    too): Preempted, when it says so."""
    return agreed_positions(model, example, stop).tolist()


def agreed_positions(model, example: Example, stop: Callable[[], bool]) -> torch.Tensor:
    """`agreement` as a bool tensor [num_targets] on the model's device, every tensor made there (a scorer
    on a GPU was once fed CPU ids, and adaptation stopped at its first contest)."""
    ids = torch.tensor([example.tokens], device=model.lm_head.weight.device)
    targets = ids[0, example.num_context :]
    predicted = []
    with torch.no_grad():
        hidden = model.model(input_ids=ids[:, :-1]).last_hidden_state[0, example.num_context - 1 :]
        for start in range(0, len(targets), SCORE_CHUNK):
            predicted.append(logits(model.lm_head, hidden[start : start + SCORE_CHUNK], stop).argmax(-1))
    return torch.cat(predicted) == targets


def score(model, examples: Iterable[Example]) -> Score:
    """A version's score over `examples` (rounds of k = 0 drafted nothing and are not scored)."""
    tokens = rounds = positions = agreed = 0
    for example in examples:
        if example.num_draft_tokens < 1 or example.num_context < 1 or example.num_targets < 1:
            continue
        agree = agreement(model, example)
        emitted, num_rounds = replay(agree, example.num_draft_tokens)
        tokens, rounds = tokens + emitted, rounds + num_rounds
        positions, agreed = positions + len(agree), agreed + sum(agree)
    return Score(tokens, rounds, positions, agreed)
