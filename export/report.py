"""The closing report of an export: how far the FP8 model is from the unquantized one.

Weight error per linear and overall (relative Frobenius norm) with the scales the export chose (one per
tensor or one per output channel), logit error and greedy next-token agreement
on a fixed set of prompts (teacher-forced: at every position, does the FP8 model's argmax equal the
unquantized model's?), and the size of the weights before and after.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

log = logging.getLogger(__name__)

TEXT_PROMPTS = (
    "The quick brown fox jumps over the lazy dog because",
    "def fibonacci(n):\n    if n < 2:\n        return n\n",
    "Speculative decoding speeds up inference by letting a small draft model",
    "In 1905 Albert Einstein published four papers that",
)
NUM_RANDOM_PROMPTS, RANDOM_PROMPT_LEN, PROMPT_SEED = 4, 32, 0


def make_prompts(source: Path, vocab_size: int) -> list[list[int]]:
    """Token ids to compare on: the text prompts through the source's tokenizer if it has one, else
    seeded random ids (random models have no tokenizer)."""
    if (source / "tokenizer.json").is_file() or (source / "tokenizer_config.json").is_file():
        try:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(source)
            prompts = [tokenizer(text)["input_ids"] for text in TEXT_PROMPTS]
            if all(prompts) and all(max(p) < vocab_size for p in prompts):
                return prompts
        except Exception as error:  # noqa: BLE001 - a broken tokenizer only changes the prompts
            log.warning("tokenizer of %s not usable (%s); comparing on random token ids", source, error)
    generator = torch.Generator().manual_seed(PROMPT_SEED)
    ids = torch.randint(0, vocab_size, (NUM_RANDOM_PROMPTS, RANDOM_PROMPT_LEN), generator=generator)
    return ids.tolist()


@torch.no_grad()
def prompt_logits(model, prompts: list[list[int]]) -> list[torch.Tensor]:
    """fp32 logits [len, vocab] of each prompt, one forward pass each."""
    return [model(torch.tensor([p])).logits[0].float() for p in prompts]


def compare_logits(reference: list[torch.Tensor], quantized: list[torch.Tensor]) -> dict:
    ref, quant = torch.cat(reference), torch.cat(quantized)  # [positions, vocab]
    agree = (ref.argmax(-1) == quant.argmax(-1)).float()
    return {
        "num_prompts": len(reference),
        "num_positions": int(ref.shape[0]),
        "greedy_agreement": agree.mean().item(),
        "logit_max_abs_error": (ref - quant).abs().max().item(),
        "logit_mean_abs_error": (ref - quant).abs().mean().item(),
        "logit_relative_error": ((ref - quant).norm() / ref.norm().clamp(min=1e-30)).item(),
    }


def build_report(
    source: str,
    mode: str,
    weight_scales: str,
    weight_errors: dict[str, float],
    logits: dict,
    size_before: int,
    size_after: int,
) -> dict:
    errors = list(weight_errors.values())
    return {
        "source": source,
        "mode": mode,
        "weight_scales": weight_scales,  # "tensor" or "channel": what the weight errors below come from
        "num_quantized_linears": len(errors),
        "weight_relative_error": {
            "overall_mean": sum(errors) / len(errors),
            "max": max(errors),
            "per_linear": weight_errors,
        },
        # torchao's dynamic-activation config needs CUDA sm89+, so logits always come from the fp8 weights
        # with unquantized activations; the engine's dynamic mode also rounds activations per tensor.
        "logits": logits | {"activations": "unquantized (fp8 weights only)"},
        "size_bytes": {"before": size_before, "after": size_after, "ratio": size_after / size_before},
    }


def log_summary(report: dict) -> None:
    weights, logits, sizes = report["weight_relative_error"], report["logits"], report["size_bytes"]
    worst = max(weights["per_linear"], key=weights["per_linear"].get)
    log.info(
        "weights: %d linears, one scale per %s, relative error mean %.4f, max %.4f (%s)",
        report["num_quantized_linears"],
        report["weight_scales"],
        weights["overall_mean"],
        weights["max"],
        worst,
    )
    log.info(
        "logits on %d prompts (%d positions): greedy next-token agreement %.1f%%, relative error %.4f, "
        "max abs error %.4f",
        logits["num_prompts"],
        logits["num_positions"],
        100 * logits["greedy_agreement"],
        logits["logit_relative_error"],
        logits["logit_max_abs_error"],
    )
    log.info(
        "size: %.2f MB -> %.2f MB (%.0f%%)", sizes["before"] / 1e6, sizes["after"] / 1e6, 100 * sizes["ratio"]
    )
