"""The recompile guard: after warmup nothing on the hot path may compile again, and if something does, it is
logged and counted (served as `drafter_recompiles_total`), never silent.

A recompile after warmup means a request met a shape or guard warmup did not cover: a multi-second stall on
the engine thread (on CUDA, also a graph that no longer matches). torch._dynamo calls its compile-start
callbacks (`torch._dynamo.callback_handler`) each time it converts a frame, first compiles and recompiles
alike, on the thread that compiles. The callbacks are process-wide, and every engine's step is the same
function (`greedy_step`), so a compile cannot be told apart by its frame: the engine marks its own decode
loops (`watching`, thread-local), and a guard counts only compiles inside its own engine's loops after it
was armed. Another engine compiling on the same thread (a benchmark or a test building several) is not a
recompile of this one.
"""

from __future__ import annotations

import logging
import threading
from contextlib import contextmanager

import torch._dynamo
from torch._dynamo.callback import CallbackArgs, CallbackTrigger

log = logging.getLogger(__name__)

_running = threading.local()  # .guard: the guard of the engine whose decode loop runs on this thread


class RecompileGuard:
    def __init__(self):
        self.count = 0
        self.armed = False

    def arm(self) -> None:
        """From now on, every dynamo compile inside this engine's loops is a recompile after warmup."""
        if not self.armed:
            torch._dynamo.callback_handler.register_start_callback(self.on_compile_start)
        self.armed = True

    def disarm(self) -> None:
        if self.armed:
            torch._dynamo.callback_handler.remove_start_callback(self.on_compile_start)
            self.armed = False

    @contextmanager
    def watching(self):
        """Around one of this engine's decode loops: compiles in it are this engine's."""
        outer = getattr(_running, "guard", None)
        _running.guard = self
        try:
            yield
        finally:
            _running.guard = outer

    def on_compile_start(self, args: CallbackArgs) -> None:
        if (
            getattr(_running, "guard", None) is not self
            or args.callback_trigger is not CallbackTrigger.DYNAMO
        ):
            return
        self.count += 1
        log.warning(
            "torch.compile recompiled after warmup (compile %s, %d so far): a shape or guard warmup did not "
            "cover; set TORCH_LOGS=recompiles for the reason",
            args.compile_id,
            self.count,
        )
