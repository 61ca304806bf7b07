"""What the server learns per conversation: the session table (sequences, capability tokens, bounds), what a
call means beyond its tokens and the acceptance tally (`speculation.py`), and the `"auto"` draft-length
policy. Knows nothing of HTTP or tensors."""
