"""What `python -m bench.acceptance --realpair [DIR]` takes from the real pair: Qwen2.5-Coder-1.5B-Instruct as
the target and Qwen2.5-Coder-0.5B-Instruct as the drafter, as `python -m bench.realpair fetch` leaves them in
DIR (build/realpair/ by default): `target/` and `drafter/` (bf16, tokenizer and chat template beside) and
the drafter's FP8 exports `drafter-fp8-weight-only/` and `drafter-fp8-dynamic/`.

- the layout a finished fetch has, checked before anything slow (one line naming the fetch if not);
- the workloads: bench/realpair/prompts.jsonl's three kinds (code, prose, edit), one workload each, every
  prompt turned into token ids by the target's own tokenizer and chat template (the assistant's turn open);
  `quick`, the two short-answer prompts per kind marked so;
- plain greedy decoding for the target: the checkpoint's generation_config.json carries chat-sampling
  defaults (Qwen2.5-Coder-Instruct: do_sample, temperature 0.7, top_p 0.8, top_k 20, repetition_penalty
  1.1); the benchmark measures greedy decoding, whose every token the drafter's greedy drafts can match, so
  they are set aside (the report lists them), and generation stops at the tokenizer's EOS (`<|im_end|>`,
  the end of a chat answer) as well as the config's.

Its defaults, sized for a 2-core CPU where the 1.5B target in float32 decodes a few tokens a second:
96 new tokens per prompt (quick: 64; most quick answers end at `<|im_end|>` before that), k = 4, 8 and auto,
draft sources model and hybrid (suffix drafting alone rarely fires on a fresh answer; hybrid shows what it
adds to the model's drafts), stopping at EOS, and a projected GPU column for this pair's shapes and one for
Qwen3-8B with Qwen3-0.6B (bench/harness/gpu_floors.py). Any of them can be given on the command line.
"""

from __future__ import annotations

from pathlib import Path

from bench.harness.prompts import TOKENIZER_FILES, BenchError
from bench.realpair.workloads import KINDS, PROMPTS_FILE, PromptsError, chat_ids, load_prompts

DEFAULT_DIR = Path(__file__).resolve().parents[2] / "build" / "realpair"  # the fetch's, in this checkout
FETCH = "python -m bench.realpair fetch"
MAX_NEW_TOKENS, QUICK_MAX_NEW_TOKENS = 96, 64
NUM_DRAFT_TOKENS = (4, 8, "auto")
SOURCES = ("model", "hybrid")
GPU_MODELS = ("qwen2.5-coder-1.5b", "qwen3-8b")  # bench/harness/gpu_floors.py's names
TARGET = "target"
SAMPLING_FIELDS = ("do_sample", "temperature", "top_p", "top_k", "min_p", "repetition_penalty")


def missing(directory: Path, drafter: str) -> str | None:
    """What a finished fetch has and `directory` lacks (its target, the `drafter` subdirectory, the target's
    tokenizer), in words; None when nothing is missing."""
    if not directory.is_dir():
        return f"{directory} does not exist"
    for name in (TARGET, drafter):
        path = directory / name
        if not (path / "config.json").is_file() or not any(path.glob("*.safetensors")):
            return f"{directory} has no {name}/ checkpoint"
    if not any((directory / TARGET / name).is_file() for name in TOKENIZER_FILES):
        return f"{directory / TARGET} has no tokenizer"
    return None


def check_fetched(directory: Path, drafter: str) -> None:
    if problem := missing(directory, drafter):
        raise BenchError(f"the real pair is not there ({problem}): run `{FETCH}` first")


def chat_tokenizer(target: Path):
    """The target's tokenizer, which must have a chat template."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(target)
    if not tokenizer.chat_template:
        raise BenchError(f"the tokenizer in {target} has no chat template: run `{FETCH}` again")
    return tokenizer


def workload_entries(tokenizer, quick: bool) -> dict[str, list[tuple[str, dict]]]:
    """Kind -> its prompts as bench.harness.prompts entries: (where, {"tokens": ids}) each."""
    try:
        return {
            kind: [
                (f"{PROMPTS_FILE.name} {prompt.id}", {"tokens": chat_ids(prompt, tokenizer)})
                for prompt in load_prompts(kind, quick)
            ]
            for kind in KINDS
        }
    except (PromptsError, ValueError) as error:
        raise BenchError(str(error)) from None


def plain_greedy(model, tokenizer) -> dict:
    """Make the target's `generate` plain greedy, stopping at the tokenizer's EOS too; returns the
    checkpoint's settings set aside and the EOS ids, for the report."""
    config = model.generation_config
    set_aside = {name: getattr(config, name, None) for name in SAMPLING_FIELDS}
    set_aside = {name: value for name, value in set_aside.items() if value is not None}
    for name in SAMPLING_FIELDS:
        setattr(config, name, None)
    eos = config.eos_token_id
    eos = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in eos:
        eos.append(tokenizer.eos_token_id)
    config.eos_token_id = eos or None
    return {"decoding": "greedy", "set_aside": set_aside, "eos_token_ids": eos}
