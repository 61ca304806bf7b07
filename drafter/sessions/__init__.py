"""What the server learns per conversation: the session table (sequences, capability tokens, bounds), what a
call means beyond its tokens (`speculation.py`) and what drafts came to (`tally.py`), the `"auto"` draft-length
policy, suffix drafting, and drafting ahead (`ahead.py`, `calibration.py`). Knows nothing of HTTP or
tensors: it raises its own errors and counts through drafter/reporting.py, and the HTTP face maps both."""
