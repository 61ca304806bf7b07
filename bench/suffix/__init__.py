"""Studies of the suffix drafts (drafter/sessions/suffix_index.py, suffix_drafts.py) on the testbed pair:

- cost.py (`python -m bench.suffix.cost`): what the index and a suffix draft cost on the CPU;
- oracle.py (`python -m bench.suffix.oracle`): how far a per-call choice between the model's draft and a
  suffix-led one could go, with a policy that knows each round's truth;
- vs_arctic.py (`python -m bench.suffix.vs_arctic`): our index against arctic-inference's.

They import the harness (bench.harness) and the testbed's pair, and nothing from the other rooms or the
benchmarks.
"""
