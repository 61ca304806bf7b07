"""The device kit carries exactly the versions this project's environment runs, never the image's torch."""

from __future__ import annotations

from importlib import metadata

from bench.device import kit as device_kit
from tests.server_process import REPO


def test_device_kit_pins_the_versions_this_environment_installs():
    command = device_kit.fetch_command(REPO / "build" / "kit")
    pinned = dict(arg.split("==") for arg in command if "==" in arg)
    assert pinned == {name: metadata.version(name) for name in device_kit.KIT}


def test_device_kit_fetches_cpython_312_wheels_only_without_dependencies():
    command = device_kit.fetch_command(REPO / "build" / "kit")
    assert command[command.index("--python-version") + 1] == "3.12"
    assert "--no-deps" in command and "--only-binary=:all:" in command
    assert sum(arg.startswith("torch==") for arg in command) == 0  # the image's torch is never replaced
    assert {arg.split("==")[0] for arg in command if "==" in arg} == set(device_kit.KIT)
