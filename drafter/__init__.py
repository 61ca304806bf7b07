"""drafter, the draft server and what a target imports to use it. Rooms, by what changes together:
- `drafter/server/`: the HTTP face: the Starlette app, routes, request bodies under deadlines, validation,
  auth, errors, metrics, the CLI and config, and the runtime that holds one server's parts;
- `drafter/scheduling/`: how requests reach the engine: the batcher, the engine thread, lone drafts on the
  event loop, and the costs measured at startup that those choices weigh;
- `drafter/sessions/`: what the server learns per conversation: the session table, acceptance and the
  `"auto"` draft-length policy;
- `drafter/client/` and `drafter/integrations/`: what runs inside a target process (no server code, no torch
  beyond the target's own): the HTTP client, the transformers `custom_generate` loop and vLLM's proposer.
Arrows run downward: the HTTP face uses scheduling and sessions, never the reverse. Below them, here at the
root: `draft_params.py` (a draft call as the HTTP face parsed it) and `reporting.py` (the metrics sessions
and scheduling report through, as Protocols the HTTP face's Prometheus metrics implement); sessions raise
their own errors, which drafter/server/errors.py maps to answers.
`python -m drafter` (drafter/__main__.py) serves.
"""
