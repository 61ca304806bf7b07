"""The recompile guard: after warmup, a torch.compile inside the engine's own decode loops is counted and logged."""

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
    # backend="eager": dynamo traces (and fires its compile callbacks) without inductor's C++ build. A code
    # object of its own each time: one shared lambda would turn its float into a symbol and stop compiling.
    function = eval(f"lambda x: x * {scale}")  # noqa: S307 - a constant expression of the test's own
    torch.compile(function, backend="eager", fullgraph=True)(torch.ones(3))


def test_a_compile_after_arming_is_counted_and_logged(guard, caplog):
    compile_once(2.0)
    assert guard.count == 0  # not armed yet: warmup compiles are expected
    guard.arm()
    compile_once(2.5)  # on this thread, but outside the engine's loops: another engine's, say
    assert guard.count == 0
    with caplog.at_level(logging.WARNING, logger="engine.recompiles"), guard.watching():
        compile_once(3.0)
    assert guard.count == 1
    assert "recompiled after warmup" in caplog.text


def test_compiles_on_other_threads_are_not_the_engines(guard):
    guard.arm()
    worker = threading.Thread(target=compile_once, args=(4.0,))
    with guard.watching():  # this thread is in the engine's loop; the worker is not
        worker.start()
        worker.join()
    assert guard.count == 0


def test_disarmed_guard_counts_nothing(guard):
    guard.arm()
    guard.disarm()
    with guard.watching():
        compile_once(5.0)
    assert guard.count == 0


def test_engine_reports_recompiles_after_warmup_in_info():
    served = Engine.load("tiny", EngineConfig())
    served.warmup()
    assert served.info()["recompiles_after_warmup"] == 0
