"""Benchmarks: per-call draft latency against the baselines a user would otherwise deploy, and the
acceptance a target model sees when it decodes with our drafts. Each runs as a module from the repository
root: `python -m bench.latency`, `python -m bench.acceptance --testbed`, ...

The benchmarks themselves sit here at the root (latency, acceptance and ahead, each with its command line
and report, overhead, client_overhead, sessions, pool_scaling, dtype_agreement, proposer_batch, and
pair_choice, how acceptance and ahead choose and open a pair); the rest lives in rooms:
- harness/: what they share: the one server launcher (also the tests'), the simulated workloads and their
  runners, prompts, the transformers target's decoding loop, baselines, machine facts and floors, the GPU
  projection, reports, a refused request as one line;
- device/: the device check, one command that tests, exports and measures on a CUDA machine in a budget;
- vllm_target/: vLLM as the target, run from its own venv, and the peer table measured with it;
- suffix/: studies of the suffix index and suffix drafts;
- testbed/: the committed target/drafter pair trained here, and its workloads.
- realpair/: the real pretrained pair (Qwen2.5-Coder 1.5B and 0.5B), fetched from the package index.

Imports run one way: harness/ imports from no other room and no benchmark; the rooms and the benchmarks
import the harness (and the testbed's pair and workloads); nothing imports a benchmark except the tests.
"""
