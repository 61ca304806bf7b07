"""vLLM as the target: a real vLLM CPU engine with drafter as its proposer (or vLLM's own methods), run from
a venv of its own, since vLLM pins other versions than the project.

- install.sh (`bash bench/vllm_target/install.sh`) makes that venv, `.venv-vllm`;
- target.py: the engine process, run by its path with the vLLM venv's Python; it imports only vLLM and the
  standard library (vLLM loads drafter's proposer by name), nothing of bench/;
- driver.py: starts target.py and drives it over stdin/stdout, from the project's venv (the vLLM tests and
  peers.py use it);
- peers.py (`python -m bench.vllm_target.peers [--realpair [DIR]]`): the peer table, on the testbed pair or
  the real pair, with peer_modes.py (how each mode speculates), peer_pairs.py (each pair's target, prompts
  and defaults) and peer_table.py (the figures and the markdown).

driver.py and the peer table import the harness (bench.harness) and the pairs (bench.testbed, and
bench.realpair's workloads and checks); nothing here imports the other rooms or the benchmarks.
"""
