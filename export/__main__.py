"""`python -m export SRC DST [--mode weight-only|dynamic] [--scales tensor|channel] [--force]`: an FP8
checkpoint of a Qwen3 or Qwen2 model, with one weight scale per linear or one per output channel.

Writes `DST/config.json`, `DST/model.safetensors`, the tokenizer files and `DST/report.json` (quantization
error against the unquantized model). Bad input exits non-zero with one line saying why.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
from pathlib import Path

# Before torch/torchao are imported: their CPU-only import chatter is not the user's concern.
for noisy in ("torchao", "torch.utils._pytree"):
    logging.getLogger(noisy).setLevel(logging.ERROR)

log = logging.getLogger("export")


def run_export(
    source: str,
    destination: str | Path,
    mode: str = "weight-only",
    force: bool = False,
    weight_scales: str = "tensor",
) -> dict:
    """Export `source` to `destination` with `weight_scales` ("tensor" or "channel") fp8 weight scales;
    return the report (also written to `destination/report.json`)."""
    import torch
    import transformers

    from engine.model.config import ARCHITECTURES
    from engine.model.loader import RANDOM_WEIGHTS_KEY
    from engine.model.presets import is_preset
    from export.checkpoint import (
        check_source,
        resolve_source,
        size_of,
        write_checkpoint,
    )
    from export.quantize import MODES, WEIGHT_SCALES, quantize_layers
    from export.report import build_report, compare_logits, log_summary, make_prompts, prompt_logits
    from export.staging import ExportError, staged_directory

    if mode not in MODES:
        raise ExportError(f"unknown mode {mode!r}; expected one of {', '.join(MODES)}")
    if weight_scales not in WEIGHT_SCALES:
        raise ExportError(f"unknown scales {weight_scales!r}; expected one of {', '.join(WEIGHT_SCALES)}")
    destination = Path(destination).expanduser()
    if destination.exists() and not force:  # before any download or work; checked again when writing
        raise ExportError(f"destination {str(destination)!r} already exists; pass --force to replace it")
    scratch_parent = None
    if Path(source).expanduser().is_file():  # a GGUF: its bf16 conversion is model-sized, so not in /tmp
        scratch_parent = destination.parent
        scratch_parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{destination.name}.source-", dir=scratch_parent) as scratch:
        directory = resolve_source(source, Path(scratch))
        if destination.resolve() == directory.resolve():
            raise ExportError("destination is the source directory; choose another destination")
        with staged_directory(destination, force) as staging:
            hf_config = check_source(directory)
            if is_preset(source):  # its weights are random; whoever serves the export must be told
                hf_config[RANDOM_WEIGHTS_KEY] = True
            log.info("loading %s", source)
            model_class = getattr(transformers, ARCHITECTURES[hf_config["model_type"]])
            model = model_class.from_pretrained(directory, dtype=torch.bfloat16).eval()
            prompts = make_prompts(directory, model.config.vocab_size)
            reference = prompt_logits(model, prompts)
            weight_errors = quantize_layers(model, weight_scales)
            logits = compare_logits(reference, prompt_logits(model, prompts))
            write_checkpoint(staging, model, hf_config, mode, directory, weight_scales)
            sizes = size_of(directory), size_of(staging)
            report = build_report(source, mode, weight_scales, weight_errors, logits, *sizes)
            (staging / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    log_summary(report)
    log.info("wrote %s (%s, %s weight scales)", destination, mode, weight_scales)
    return report


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m export", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "source",
        metavar="SRC",
        help="Qwen3 or Qwen2 directory, GGUF file, hub id (owner/name), or preset (tiny, bench-cpu, qwen3-0.6b-random)",
    )
    parser.add_argument("destination", metavar="DST", help="directory to create")
    parser.add_argument("--mode", default="weight-only", help="weight-only (default) or dynamic")
    parser.add_argument(
        "--scales",
        default="tensor",
        help="fp8 weight scales: tensor (default; one per linear) or channel (one per output row, "
        "compressed-tensors' strategy 'channel': closer weights where rows differ in magnitude)",
    )
    parser.add_argument("--force", action="store_true", help="replace DST if it exists")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    from export.staging import ExportError

    try:
        run_export(args.source, args.destination, args.mode, args.force, args.scales)
    except ExportError as error:
        print(f"export: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
