"""The trainer (drafter/adaptation/trainer.py, lora.py): full fine-tuning leaves the embedding as it was and
lowers the loss on what it trains on; low-rank adapters start exactly at the base weights, and their merged
weights are the adapted model's, so a version made from them drafts as the model that trained."""

from __future__ import annotations

import pytest
import torch

from drafter.adaptation.buffer import Example
from drafter.adaptation.trainer import Trainer, hf_model
from tests.oracle import make_hf_model


def setup(name: str):
    model = make_hf_model(name)
    hf_config = model.config.to_dict()
    generator = torch.Generator().manual_seed(4)
    tokens = torch.randint(0, model.config.vocab_size, (60,), generator=generator).tolist()
    return model, hf_config, [Example("s", tokens, 20, 4, False)]


def loss_of(model, example: Example) -> float:
    ids = torch.tensor([example.tokens])
    with torch.no_grad():
        logits = model(ids[:, :-1]).logits[0, example.num_context - 1 :]
    return torch.nn.functional.cross_entropy(logits, ids[0, example.num_context :]).item()


@pytest.mark.parametrize("rank", [0, 8])
@pytest.mark.parametrize("name", ["gqa2-untied", "qwen2-gqa2-tied"])
def test_training_lowers_the_loss_and_its_state_is_the_trained_model(name, rank, one_thread):
    model, hf_config, examples = setup(name)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    trainer = Trainer(hf_config, state, 3e-3, 64, adapter_rank=rank)
    if rank:  # B starts at zero: the merged weights are the base weights, bit for bit
        assert all(torch.equal(trainer.state()[k], v) for k, v in state.items() if k in trainer.state())
    before = loss_of(hf_model(hf_config, trainer.state()), examples[0])
    for _ in range(30):
        trainer.step(examples)
    merged = hf_model(hf_config, trainer.state())
    assert loss_of(merged, examples[0]) < 0.7 * before
    ids = torch.tensor([examples[0].tokens])
    with torch.no_grad():
        assert torch.allclose(merged(ids).logits, trainer.model(ids).logits, atol=1e-4)
    embedding = "model.embed_tokens.weight"
    assert torch.equal(trainer.state()[embedding], state[embedding])  # frozen either way


def test_a_request_after_the_backward_leaves_the_update_for_the_next_call(one_thread):
    """The update (clipping, AdamW) is a piece of its own: a request arriving after the backward finds it
    not begun, and the next call makes exactly the step an uninterrupted trainer made."""
    model, hf_config, examples = setup("gqa2-untied")
    state = {k: v.clone() for k, v in model.state_dict().items()}
    whole, cut = (Trainer(hf_config, state, 3e-3, 64, adapter_rank=8) for _ in range(2))
    loss = whole.step(examples)
    assert cut.step(examples, stop=lambda: cut.pending_loss is not None) is None
    assert all(torch.equal(cut.state()[k], v) for k, v in state.items() if k in cut.state())  # no update yet
    assert cut.step(examples) == loss
    assert all(torch.equal(cut.state()[k], v) for k, v in whole.state().items())
    assert not all(torch.equal(whole.state()[k], v) for k, v in state.items() if k in whole.state())
