"""The recompile guard: after warmup nothing on the hot path may compile again, and if something does, it is
logged and counted (served as `drafter_recompiles_total`), never silent.

A recompile after warmup means a request met a shape or guard warmup did not cover: a multi-second stall on
the engine thread (on CUDA, also a graph that no longer matches). torch._dynamo calls its compile-start
callbacks (`torch._dynamo.callback_handler`) each time it converts a frame, first compiles and recompiles
alike, on the thread that compiles. The callbacks are process-wide, so the guard counts only compiles on
the thread that armed it (the engine's, which owns the device) and only after it was armed.
"""

from __future__ import annotations

import logging
import threading

import torch._dynamo
from torch._dynamo.callback import CallbackArgs, CallbackTrigger

log = logging.getLogger(__name__)


class RecompileGuard:
    def __init__(self):
        self.count = 0
        self.thread: int | None = None

    def arm(self) -> None:
        """From now on, every dynamo compile on this thread is a recompile after warmup."""
        if self.thread is None:
            torch._dynamo.callback_handler.register_start_callback(self.on_compile_start)
        self.thread = threading.get_ident()

    def disarm(self) -> None:
        if self.thread is not None:
            torch._dynamo.callback_handler.remove_start_callback(self.on_compile_start)
            self.thread = None

    def on_compile_start(self, args: CallbackArgs) -> None:
        if threading.get_ident() != self.thread or args.callback_trigger is not CallbackTrigger.DYNAMO:
            return
        self.count += 1
        log.warning(
            "torch.compile recompiled after warmup (compile %s, %d so far): a shape or guard warmup did not "
            "cover; set TORCH_LOGS=recompiles for the reason",
            args.compile_id,
            self.count,
        )
