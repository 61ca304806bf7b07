"""What the adaptation trainer's learning rate and adapter rank do to a real drafter, offline and exactly:
held-out tokens per round over training steps, each setting against the pretrained drafter.

    python -m bench.adapt.sweep [--realpair DIR] [--prompts 36] [--max-new-tokens 64] [--k 4] \
        [--roots drafter,engine,export] [--split modules] [--settings 8:1e-4,8:3e-4,8:1e-3,0:1e-4] \
        [--steps 96] [--score-every 16] [--target-batch 16] [--outputs-from REPORT] [--out DIR]

bench/adapt/run.py measures adaptation as a server does it, and on the real pair every candidate it made (rank-8
adapters at 1e-3) scored worse than the pretrained drafter, in a run that takes 25 minutes for ~600 target
tokens. This replays the server's own trainer and scorer on the same stream without servers or drafting: the
target's greedy output for each of the stream's first `--prompts` prompts (bench/adapt/stream.py: this
project's Python, function bodies), each an example as the server's buffer keeps one (the 256 tokens of
prompt before the target's first token, then its tokens); the first two thirds of the prompts are the
training traffic and the last third, later traffic from other modules, is held out (`--split modules`), or
(`--split halves`) the first half of every output is trained on and its second half, the same
conversation's later tokens with the first half as context, is held out: whether a drafter learns a long
generation's own content as it goes. For each setting
(`rank:learning-rate`, rank 0 training every decoder weight), a fresh `Trainer` (drafter/adaptation/trainer.py)
takes `--steps` steps, and every `--score-every` steps its weights are made into a candidate exactly as the
cycle makes one (merged, quantized in the served FP8 mode by the export's code, dequantized into the scorer)
and scored on the held-out examples as the cycle scores one (drafter/adaptation/score.py: tokens per round at
k, replayed from teacher-forced agreement), and on the training examples (what it learned). Version 0 is the
served FP8 export's weights. Tokens per round are exact and do not depend on the machine; step times do.
The target decodes `--target-batch` prompts at a time (96 prompts of 64 tokens: 14 minutes on 2 AMD EPYC
cores, where one at a time took 28 for 36); `--outputs-from REPORT` takes its outputs from an earlier sweep's
report.json instead.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

from bench.adapt.args import REALPAIR_RUN, add_roots_argument
from bench.adapt.stream import code_stream_prompts
from bench.harness.decoding import PAIR_DRAFTERS, load_target, target_greedy_batch
from bench.harness.machine import describe
from bench.harness.prompts import BenchError
from bench.harness.report import publish
from bench.realpair.benchmark import DEFAULT_DIR, check_fetched
from drafter.adaptation.buffer import Example, TrafficBuffer
from drafter.adaptation.score import Score, score
from drafter.adaptation.settings import CycleSettings
from drafter.adaptation.trainer import Trainer, hf_model
from engine.model.loader import checkpoint_files, read_tensors
from export.versions import dense_state, served_tensors

CONTEXT_WINDOW = TrafficBuffer.context_window  # the prompt tokens the server's buffer keeps before a target's
STEP_TOKENS = CycleSettings().step_tokens
K = REALPAIR_RUN["num_draft_tokens"]  # bench.adapt --realpair's k, the default


def setting(text: str) -> tuple[int, float]:
    rank, _, rate = text.partition(":")
    try:
        parsed = int(rank), float(rate)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected RANK:LEARNING_RATE, got {text!r}") from None
    if parsed[0] < 0 or not parsed[1] >= 0:
        raise argparse.ArgumentTypeError(f"a rank is >= 0 and a learning rate >= 0, got {text!r}")
    return parsed


def split(
    prompts: list[dict], outputs: list[list[int]], k: int, by: str
) -> tuple[list[Example], list[Example]]:
    """The training and the held-out examples: other modules held out (`modules`) or outputs' later halves."""
    if by == "modules":
        cut = 2 * len(prompts) // 3
        return (
            examples(prompts[:cut], outputs[:cut], k, held_out=False),
            examples(prompts[cut:], outputs[cut:], k, held_out=True),
        )
    firsts = [output[: len(output) // 2] for output in outputs]
    seconds = [output[len(first) :] for output, first in zip(outputs, firsts, strict=True)]
    later = [{**p, "tokens": [*p["tokens"], *first]} for p, first in zip(prompts, firsts, strict=True)]
    return examples(prompts, firsts, k, held_out=False), examples(later, seconds, k, held_out=True)


def examples(prompts: list[dict], outputs: list[list[int]], k: int, held_out: bool) -> list[Example]:
    made = []
    for prompt, output in zip(prompts, outputs, strict=True):
        context = prompt["tokens"][-CONTEXT_WINDOW:]
        made.append(Example(prompt["name"], [*context, *output], len(context), k, held_out))
    return made


class Candidates:
    """Makes a trainer's weights into a candidate as the cycle does and scores it (one scorer model, reloaded)."""

    def __init__(self, hf_config: dict, quantization: str, dtype: torch.dtype, v0: dict[str, torch.Tensor]):
        self.hf_config, self.quantization, self.dtype = hf_config, quantization, dtype
        self.tied = bool(hf_config.get("tie_word_embeddings"))
        self.scorer = hf_model(hf_config, dense_state(v0))

    def score(self, state: dict[str, torch.Tensor], *example_sets: list[Example]) -> list[Score]:
        served = served_tensors(state, self.quantization, self.dtype, self.tied)
        self.scorer.load_state_dict(dense_state(served), strict=False)
        return [score(self.scorer, examples) for examples in example_sets]


def sweep(
    hf_config: dict,
    quantization: str,
    dtype: torch.dtype,  # the served dtype (unquantized tensors)
    v0: dict[str, torch.Tensor],
    training: list[Example],
    held_out: list[Example],
    settings: list[tuple[int, float]],
    steps: int,
    score_every: int,
    progress=None,
) -> dict:
    """Per setting, the held-out and training scores after every `score_every` steps (step 0: version 0)."""
    candidates = Candidates(hf_config, quantization, dtype, v0)
    base_held_out, base_training = candidates.score(dense_state(v0), held_out, training)
    results = []
    for rank, rate in settings:
        trainer = Trainer(hf_config, dense_state(v0), rate, STEP_TOKENS, adapter_rank=rank)
        points, step_s = [], []
        for step in range(1, steps + 1):
            began = time.perf_counter()
            trainer.step(training)
            step_s.append(time.perf_counter() - began)
            if step % score_every == 0 or step == steps:
                on_held_out, on_training = candidates.score(trainer.state(), held_out, training)
                points.append(
                    {
                        "step": step,
                        "held_out": on_held_out.describe(),
                        "held_out_ratio": on_held_out.tokens_per_round / base_held_out.tokens_per_round,
                        "training": on_training.describe(),
                        "training_ratio": on_training.tokens_per_round / base_training.tokens_per_round,
                    }
                )
            if progress is not None:
                progress.update()
        step_s.sort()
        results.append(
            {"rank": rank, "learning_rate": rate, "step_s_median": step_s[len(step_s) // 2], "points": points}
        )
        del trainer
    return {
        "version_0": {"held_out": base_held_out.describe(), "training": base_training.describe()},
        "settings": results,
    }


def markdown(report: dict) -> str:
    base = report["sweep"]["version_0"]
    held_out = base["held_out"]
    lines = [
        f"Version 0 (the served FP8 export): held-out {held_out['tokens_per_round']:.3f} tokens per round "
        f"at k = {report['config']['k']} ({held_out['rounds']} rounds, agreement {held_out['agreement']}), "
        f"training traffic {base['training']['tokens_per_round']:.3f}.",
        "",
        "| rank | learning rate | step s (median) | "
        + " | ".join(
            f"step {p['step']}: held-out / training" for p in report["sweep"]["settings"][0]["points"]
        )
        + " |",
        "|---|---|---|" + "---|" * len(report["sweep"]["settings"][0]["points"]),
    ]
    for result in report["sweep"]["settings"]:
        cells = [f"{p['held_out_ratio']:.3f} / {p['training_ratio']:.3f}" for p in result["points"]]
        lines.append(
            f"| {result['rank']} | {result['learning_rate']:g} | {result['step_s_median']:.2f} | "
            + " | ".join(cells)
            + " |"
        )
    return "\n".join(lines) + "\n"


def target_outputs(args, prompts: list[dict]) -> list[list[int]]:
    if args.outputs_from is not None:
        earlier = json.loads(args.outputs_from.read_text())
        by_name = {row["name"]: row["output"] for row in earlier["prompts"]}
        missing = [p["name"] for p in prompts if p["name"] not in by_name]
        if missing:
            raise BenchError(f"{args.outputs_from} has no output for {len(missing)} of the prompts")
        return [by_name[p["name"]][: args.max_new_tokens] for p in prompts]
    model = load_target(args.directory / "target", "cpu", "float32")
    outputs = []
    with tqdm(total=len(prompts), desc="target", unit="prompt", file=sys.stderr) as progress:
        for first in range(0, len(prompts), args.target_batch):
            group = [p["tokens"] for p in prompts[first : first + args.target_batch]]
            outputs.extend(target_greedy_batch(model, group, args.max_new_tokens))
            progress.update(len(group))
    del model
    return outputs


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--realpair", dest="directory", type=Path, default=DEFAULT_DIR, help="the fetched pair"
    )
    parser.add_argument("--prompts", type=int, default=36, help="prompts of the stream [36]")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="the target's tokens a prompt [64]")
    parser.add_argument(
        "--settings",
        type=lambda text: [setting(part) for part in text.split(",")],
        default=[(8, 1e-4), (8, 3e-4), (8, 1e-3), (0, 1e-4)],
        help="RANK:LEARNING_RATE,... (rank 0: every decoder weight) [8:1e-4,8:3e-4,8:1e-3,0:1e-4]",
    )
    parser.add_argument(
        "--k", type=int, default=K, help=f"the drafts a round, as the examples' sessions ask [{K}]"
    )
    add_roots_argument(parser)
    parser.add_argument(
        "--split",
        choices=("modules", "halves"),
        default="modules",
        help="held out: the last third of the prompts, or every output's second half [modules]",
    )
    parser.add_argument("--steps", type=int, default=96, help="training steps per setting [96]")
    parser.add_argument("--score-every", type=int, default=16, help="steps between two scores [16]")
    parser.add_argument(
        "--target-batch", type=int, default=16, help="prompts the target decodes at once [16]"
    )
    parser.add_argument(
        "--outputs-from", type=Path, help="an earlier sweep's report.json: its target outputs"
    )
    parser.add_argument("--out", type=Path, help="write report.json and report.md here")
    args = parser.parse_args(argv)
    if (
        min(args.prompts, args.max_new_tokens, args.k, args.steps, args.score_every, args.target_batch) < 1
        or args.prompts < 3
    ):
        parser.error(
            "--prompts (at least 3), --max-new-tokens, --k, --steps, --score-every and --target-batch must"
            " be positive"
        )
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(2)
    try:
        drafter = args.directory / PAIR_DRAFTERS["weight-only"]
        check_fetched(args.directory, PAIR_DRAFTERS["weight-only"])
        tokenizer = args.directory / "target" / "tokenizer.json"
        prompts, source = code_stream_prompts(args.prompts, tokenizer, args.roots)
        outputs = target_outputs(args, prompts)
    except (BenchError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    hf_config = json.loads((drafter / "config.json").read_text())
    v0 = read_tensors(checkpoint_files(drafter))
    training, held_out = split(prompts, outputs, args.k, args.split)
    with tqdm(total=args.steps * len(args.settings), desc="steps", file=sys.stderr) as progress:
        result = sweep(
            hf_config,
            "fp8-weight-only",
            torch.bfloat16,
            v0,
            training,
            held_out,
            args.settings,
            args.steps,
            args.score_every,
            progress,
        )
    report = {
        "sweep": result,
        "prompts": [{"name": p["name"], "output": o} for p, o in zip(prompts, outputs, strict=True)],
        "config": {
            "drafter": str(drafter),
            "stream": source,
            "split": args.split,
            "training_examples": len(training),
            "held_out_examples": len(held_out),
            "max_new_tokens": args.max_new_tokens,
            "k": args.k,
            "steps": args.steps,
            "score_every": args.score_every,
        },
        "machine": describe("cpu"),
    }
    publish(report, markdown(report), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
