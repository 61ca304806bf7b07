"""Online adaptation (`--adapt`, docs/adaptation.md): the buffer of what targets emitted on live traffic, the
scorer that replays a weights version's rounds on it, and the trainer and versions that turn it into better
drafter weights. Knows nothing of HTTP; the engine only offers `Engine.weight_swap`."""
