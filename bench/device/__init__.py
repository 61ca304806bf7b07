"""The device check: one command for a CUDA machine with no network that tests, exports and measures the
drafter in stages, each in a process of its own, within a wall-clock budget, rewriting its report after
every stage.

- check.py (`python -m bench.device.check`) runs the plan; check.sh (`bash bench/device/check.sh --out DIR`)
  installs the device kit first and runs it;
- kit.py (`python -m bench.device.kit fetch`): the wheels the GPU image lacks, fetched on a machine with a
  registry;
- plan.py: the stages in order; stages.py (`python -m bench.device.stages SPEC.json`): one stage;
  report.py: the report's Markdown and plot.

It imports the harness (bench.harness) and nothing from the other rooms or the benchmarks.
"""
