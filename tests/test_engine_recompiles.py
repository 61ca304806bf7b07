"""The recompile guard: after warmup, a torch.compile on the engine's thread is counted and logged."""

from __future__ import annotations

import logging
import threading

import pytest
import torch

from engine.config import EngineConfig
from engine.engine import Engine
from engine.recompiles import RecompileGuard


@pytest.fixture
def guard():
    armed = RecompileGuard()
    yield armed
    armed.disarm()


def compile_once(scale: float) -> None:
    # backend="eager": dynamo traces (and fires its compile callbacks) without inductor's C++ build.
    torch.compile(lambda x: x * scale, backend="eager", fullgraph=True)(torch.ones(3))


def test_a_compile_after_arming_is_counted_and_logged(guard, caplog):
    compile_once(2.0)
    assert guard.count == 0  # not armed yet: warmup compiles are expected
    guard.arm()
    with caplog.at_level(logging.WARNING, logger="engine.recompiles"):
        compile_once(3.0)
    assert guard.count == 1
    assert "recompiled after warmup" in caplog.text


def test_compiles_on_other_threads_are_not_the_engines(guard):
    guard.arm()
    worker = threading.Thread(target=compile_once, args=(4.0,))
    worker.start()
    worker.join()
    assert guard.count == 0


def test_disarmed_guard_counts_nothing(guard):
    guard.arm()
    guard.disarm()
    compile_once(5.0)
    assert guard.count == 0


def test_engine_reports_recompiles_after_warmup_in_info():
    served = Engine.load("tiny", EngineConfig())
    served.warmup()
    assert served.info()["recompiles_after_warmup"] == 0
