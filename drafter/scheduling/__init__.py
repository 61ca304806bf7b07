"""How requests reach the engine: the batcher (a bounded queue, deadlines, one batch at a time), the thread
that owns the device, which lone requests the event loop drafts itself, and the costs measured at startup
that those choices and `"auto"` weigh. Knows nothing of HTTP."""
