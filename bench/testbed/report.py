"""The build's report, measured on the saved (bfloat16) weights: held-out loss of both models, and the
drafter's greedy agreement with the target by draft position on each workload.

Agreement: the target decodes each prompt greedily; from every `AGREEMENT_STRIDE`-th point of that
continuation the drafter drafts `agreement_positions` tokens greedily. `agreement[i]` is the share of those
drafts whose first i + 1 tokens all equal the target's (the chance a speculative round accepts position i),
so a round with k drafts keeps 1 + sum(agreement[:k]) tokens on average (the target's own token included).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from bench.testbed.train import EOS_ID, windows

AGREEMENT_STRIDE = 4
TOKENS_PER_ROUND_AT = (2, 4, 8, 16)


@torch.inference_mode()
def held_out_loss(model, held_out_ids: list[list[int]], seq_len: int, num_windows: int) -> float:
    data = windows(held_out_ids, seq_len)[:num_windows]
    total = 0.0
    for batch in data.split(8):
        logits = model(input_ids=batch[:, :-1]).logits.float()
        total += F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten(), reduction="sum").item()
    return total / (len(data) * seq_len)


@torch.inference_mode()
def greedy(model, tokens: list[int], max_new_tokens: int) -> list[int]:
    ids = torch.tensor([tokens])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                         max_new_tokens=max_new_tokens, eos_token_id=EOS_ID, pad_token_id=EOS_ID)  # fmt: skip
    new = out[0, len(tokens) :].tolist()
    return new[: new.index(EOS_ID) + 1] if EOS_ID in new else new


def agreement(target, drafter, prompts: list[list[int]], new_tokens: int, positions: int) -> dict:
    matched, starts, distinct = [0] * positions, 0, []
    for prompt in prompts:
        continuation = greedy(target, prompt, new_tokens)
        distinct.append(len(set(continuation)) / max(1, len(continuation)))
        for start in range(0, len(continuation) - positions + 1, AGREEMENT_STRIDE):
            draft = greedy(drafter, prompt + continuation[:start], positions)
            expected = continuation[start : start + positions]
            starts += 1
            for i in range(positions):
                if draft[: i + 1] != expected[: i + 1]:
                    break
                matched[i] += 1
    by_position = [m / starts if starts else None for m in matched]
    rounds = {k: 1 + sum(by_position[:k]) for k in TOKENS_PER_ROUND_AT if starts and k <= positions}
    # How much the target's continuations repeat themselves (1: no token twice): loops flatter any drafter.
    distinct_share = sum(distinct) / len(distinct)
    return {
        "by_position": by_position,
        "tokens_per_round": rounds,
        "drafts": starts,
        "distinct_share": distinct_share,
    }


def markdown(report: dict) -> str:
    losses = report["held_out_loss"]
    lines = [
        "# Testbed pair",
        "",
        f"Recipe `{report['recipe_key']}`; corpus `{report['corpus_hash'][:16]}`; built in "
        f"{report['build_s'] / 60:.1f} min on {report['machine']}.",
        "",
        "| model | parameters | FLOPs/token | held-out loss (nats) |",
        "|---|---|---|---|",
    ]
    for name in ("target", "drafter"):
        model = report["models"][name]
        lines.append(
            f"| {name} | {model['parameters']:,} | {model['flops_per_token']:,} | {losses[name]:.3f} |"
        )
    lines += ["", f"Cost ratio {report['cost_ratio']:.2f}x; loss gap {losses['drafter'] - losses['target']:.3f}.",
              "", "Drafter greedy agreement with the target (share of drafts accepted through each position):",
              ""]  # fmt: skip
    positions = len(next(iter(report["agreement"].values()))["by_position"])
    lines += ["| workload | drafts | " + " | ".join(str(i + 1) for i in range(positions)) + " | tokens/round at k = "
              + ", ".join(map(str, TOKENS_PER_ROUND_AT)) + " | distinct tokens in the target's continuation |",
              "|---" * (positions + 4) + "|"]  # fmt: skip
    for workload, result in report["agreement"].items():
        cells = " | ".join(f"{a:.2f}" for a in result["by_position"])
        rounds = ", ".join(f"{v:.2f}" for v in result["tokens_per_round"].values())
        lines.append(
            f"| {workload} | {result['drafts']} | {cells} | {rounds} | {result['distinct_share']:.2f} |"
        )
    return "\n".join(lines) + "\n"
