"""The split backward of a bubble-filled schedule (B: input gradient, W: weight gradient later)
gives bitwise the gradients of the full backward, on every kind of stage of the runtime's GPT."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from chameleon_opt.runtime.gpt import GPTConfig, batch_tokens, build_layer, sample_loss  # noqa: E402
from chameleon_opt.runtime.split_backward import split_backward  # noqa: E402

CFG = GPTConfig(layers=2, hidden=16, heads=2, vocab=32, seq_len=8)


def _stage(first: int, end: int, x: torch.Tensor | None, tokens: torch.Tensor
           ) -> tuple[list[torch.nn.Module], torch.Tensor, torch.Tensor | None]:
    """The stage's modules (fresh, seed 0), its output (the loss on the last stage) and its input leaf."""
    modules = [build_layer(CFG, layer, 0, torch.float64) for layer in range(first, end)]
    out = tokens[:, :-1] if x is None else x.clone().requires_grad_(True)
    leaf = None if x is None else out
    for module in modules:
        out = module(out)
    if end == CFG.num_layers:
        out = sample_loss(out, tokens[:, 1:]).sum()
    return modules, out, leaf


@pytest.mark.parametrize("first, end", [(0, 2), (1, 3), (2, 4), (0, 4)])
def test_split_backward_equals_the_full_backward_bitwise(first: int, end: int) -> None:
    torch.set_num_threads(1)
    tokens = batch_tokens(CFG, 0, 0, 3)
    generator = torch.Generator().manual_seed(1)
    x = None if first == 0 else torch.randn(3, CFG.seq_len, CFG.hidden, generator=generator, dtype=torch.float64)
    grad = None if end == CFG.num_layers else \
        torch.randn(3, CFG.seq_len, CFG.hidden, generator=generator, dtype=torch.float64)
    full_modules, out, leaf = _stage(first, end, x, tokens)
    out.backward(grad)
    split_modules, out, split_leaf = _stage(first, end, x, tokens)
    params = [p for module in split_modules for p in module.parameters()]
    x_grad, weights = split_backward(out, split_leaf, grad, params)
    del out  # as the worker does: W keeps what it needs of the graph
    if split_leaf is not None:
        assert leaf is not None and x_grad is not None and torch.equal(x_grad, leaf.grad)
        assert split_leaf.grad is None  # B leaves no gradient behind
    assert all(p.grad is None for p in params)  # nor does it touch the weights
    weights()
    for full, split in zip(full_modules, split_modules):
        for (name, a), b in zip(full.named_parameters(), split.parameters()):
            assert b.grad is not None and torch.equal(a.grad, b.grad), name


@pytest.mark.parametrize("family", ["tiny-llama", "tiny-gpt2"])
@pytest.mark.parametrize("mode", ["none", "full", "selective", "offload"])
def test_split_backward_of_an_hf_stage_equals_the_full_backward_in_every_activation_mode(family: str,
                                                                                        mode: str) -> None:
    """The HF runtime splits a rerouted stage's backward whatever memory relief the planner gave
    it: a checkpointed block (`full`) or attention core (`selective`) is recomputed inside B and W
    needs that graph again, an offloaded activation is read back twice; the gradients must still
    be the full backward's, bitwise."""
    pytest.importorskip("transformers")
    from pathlib import Path

    from chameleon_opt.runtime import hf

    torch.set_num_threads(1)
    config = hf.load_config(Path(__file__).resolve().parent.parent / "models" / "hf" / family / "config.json")
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(2, 8, config.hidden_size, generator=generator, dtype=torch.float64)
    grad = torch.randn(2, 8, config.hidden_size, generator=generator, dtype=torch.float64)
    grads = []
    for split in (False, True):
        stage = hf.Stage(hf.build_model(config, 0, torch.float64), config, 1, 3)
        stage.set_activation_mode(mode)
        params = list(stage.parameters())
        leaf = x.clone().requires_grad_(True)
        out = stage(leaf)
        if split:
            x_grad, weights = split_backward(out, leaf, grad, params)
            weights()
        else:
            out.backward(grad)
            x_grad = leaf.grad
        grads.append([x_grad, *(p.grad for p in params)])
    assert all(torch.equal(a, b) for a, b in zip(*grads))
