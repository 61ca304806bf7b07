"""The build, step by step: corpus, tokenizer, target, the target's continuations, drafter (distilled on
them), the drafter's two FP8 exports, the workloads, the report, and last the manifest (the recipe's key,
the corpus's hash, every file's sha256), which `check` compares against. Progress goes to stderr; the
build writes into a staging folder and replaces the destination only when it has finished, so an
interrupted build leaves the old pair intact.

Output (bench/testbed/pair/ by default):
    target/  drafter/                      HF directories (bfloat16, the tokenizer in each)
    drafter-fp8-weight-only/  drafter-fp8-dynamic/   `python -m export` of the drafter
    workloads/{prose,code,edit}.jsonl
    report.json  report.md  manifest.json
"""

from __future__ import annotations

import hashlib
import json
import logging
import platform
import shutil
import sys
import time
from pathlib import Path

import torch

from bench.testbed.corpus import edit_documents, load_corpus
from bench.testbed.recipe import Recipe
from bench.testbed.report import agreement, held_out_loss, markdown
from bench.testbed.tokenizer import encode_documents, save_tokenizer, train_tokenizer
from bench.testbed.train import (
    BUILD_THREADS,
    distillation_loss,
    flops_per_token,
    new_model,
    next_token_loss,
    target_continuations,
    to_saved_precision,
    train,
    windows,
)
from bench.testbed.workloads import build_workloads, write_workloads

PAIR = Path(__file__).resolve().parent / "pair"
FP8_MODES = ("weight-only", "dynamic")
MANIFEST = "manifest.json"
log = logging.getLogger("bench.testbed")


def file_hashes(directory: Path) -> dict[str, str]:
    return {
        str(path.relative_to(directory)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(directory.rglob("*"))
        if path.is_file() and path.name != MANIFEST
    }


def cpu_name() -> str:
    from bench.harness.machine import describe

    return f"{describe('cpu')['cpu']}, {BUILD_THREADS} threads"


def build(recipe: Recipe, destination: Path) -> dict:
    """Builds the pair into `destination` (replaced at the end); returns the report."""
    torch.set_num_threads(BUILD_THREADS)
    started = time.perf_counter()
    staging = destination.with_name(destination.name + ".building")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)

    log.info("corpus: the standard library of Python %s", platform.python_version())
    corpus = load_corpus(recipe.held_out_per_mille, recipe.max_files)
    code = [d for d in corpus.train if d.kind == "code"]
    training_documents = corpus.train + edit_documents(
        code, recipe.seed, recipe.edit_every, recipe.edit_lines
    )
    log.info("corpus: %d training documents, %d held out", len(training_documents), len(corpus.held_out))

    tokenizer = train_tokenizer([d.text for d in training_documents], recipe.vocab_size)
    data = windows(encode_documents(tokenizer, [d.text for d in training_documents]), recipe.seq_len)
    held_out_ids = encode_documents(tokenizer, [d.text for d in corpus.held_out])
    log.info(
        "tokenizer: %d tokens; %d training windows of %d",
        tokenizer.get_vocab_size(),
        len(data),
        recipe.seq_len,
    )

    workloads = build_workloads(corpus, tokenizer, recipe)
    write_workloads(workloads, staging / "workloads")
    target = new_model(recipe.target, recipe, recipe.seed)
    train(target, data, recipe.target_training, recipe.seed, "target", next_token_loss)
    target = to_saved_precision(target)  # the drafter learns from the target as shipped
    continuations = target_continuations(
        target, data, recipe.distillation_sequences, recipe.distillation_new_tokens, recipe.seed + 1
    )
    drafter = new_model(recipe.drafter, recipe, recipe.seed + 1)
    train(
        drafter, continuations, recipe.drafter_training, recipe.seed + 1, "drafter", distillation_loss(target)
    )
    drafter = to_saved_precision(drafter)

    for name, model in (("target", target), ("drafter", drafter)):
        model.to(torch.bfloat16).save_pretrained(staging / name)
        model.float()
        save_tokenizer(tokenizer, staging / name)
    export_drafter(staging)

    log.info("report: held-out loss and agreement")
    num_windows = recipe.eval_batches * 8
    report = {
        "recipe_key": recipe.key(),
        "corpus_hash": corpus.content_hash(),
        "machine": cpu_name(),
        "models": {
            name: {
                "parameters": sum(p.numel() for p in m.parameters()),
                "flops_per_token": flops_per_token(m),
            }
            for name, m in (("target", target), ("drafter", drafter))
        },
        "held_out_loss": {
            name: held_out_loss(m, held_out_ids, recipe.seq_len, num_windows)
            for name, m in (("target", target), ("drafter", drafter))
        },
        "agreement": {
            workload: agreement(
                target,
                drafter,
                [p["tokens"] for p in prompts],
                recipe.workload_new_tokens,
                recipe.agreement_positions,
            )  # fmt: skip
            for workload, prompts in workloads.items()
        },
    }
    report["cost_ratio"] = (
        report["models"]["target"]["flops_per_token"] / report["models"]["drafter"]["flops_per_token"]
    )
    report["build_s"] = time.perf_counter() - started
    (staging / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    (staging / "report.md").write_text(markdown(report))
    manifest = {
        "recipe_key": recipe.key(),
        "recipe": recipe.as_dict(),
        "corpus_hash": corpus.content_hash(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "threads": BUILD_THREADS,
        "files": file_hashes(staging),
    }
    (staging / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    shutil.rmtree(destination, ignore_errors=True)
    staging.rename(destination)
    log.info("built %s in %.1f min", destination, report["build_s"] / 60)
    return report


def export_drafter(directory: Path) -> None:
    from export.__main__ import run_export

    for mode in FP8_MODES:
        log.info("export: drafter, FP8 %s", mode)
        destination = directory / f"drafter-fp8-{mode}"
        run_export(str(directory / "drafter"), destination, mode, force=True)
        name_source_relatively(destination)


def name_source_relatively(export_directory: Path) -> None:
    """The export's report names its source by the path it was given, here the staging folder's: it
    becomes the sibling it is committed beside, so two builds anywhere write the same bytes."""
    path = export_directory / "report.json"
    report = json.loads(path.read_text())
    report["source"] = "../drafter"
    path.write_text(json.dumps(report, indent=2) + "\n")  # as export writes it


class MismatchError(Exception):
    """The pair on disk is not what its recipe builds."""


def check(recipe: Recipe, directory: Path) -> dict:
    """The manifest matches the recipe and every file matches the manifest; the manifest, else raises."""
    path = directory / MANIFEST
    if not path.is_file():
        raise MismatchError(f"{directory} has no {MANIFEST}: build it with `python -m bench.testbed build`")
    manifest = json.loads(path.read_text())
    if manifest["recipe_key"] != recipe.key():
        raise MismatchError(
            f"{directory} was built from recipe {manifest['recipe_key']}, not {recipe.key()}: rebuild it"
        )
    found = file_hashes(directory)
    differing = sorted(
        set(found) ^ set(manifest["files"]) | {f for f in found if found[f] != manifest["files"].get(f)}
    )
    if differing:
        raise MismatchError(
            f"{directory}: {len(differing)} files differ from the manifest, e.g. {differing[0]}"
        )
    return manifest


def main_log() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stderr)
