"""The training loss: a chunk of rows at a time, equal to torch's cross-entropy in value and gradient; torch's when compiled."""

import pytest
import torch
from torch.nn import functional as F

from factory.data.loader import PAD
from factory.train import objective
from factory.train.objective import summed_cross_entropy


def chunked(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The chunked path itself (`summed_cross_entropy` takes it for logits below float32)."""
    return objective._SummedCrossEntropy.apply(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


@pytest.mark.parametrize("chunk_rows", [1, 3, 10])
def test_the_chunked_loss_is_torchs_cross_entropy_in_value_and_gradient_whatever_the_chunk(monkeypatch, chunk_rows):
    vocab = 16
    monkeypatch.setattr(objective, "CHUNK_ELEMENTS", vocab * chunk_rows)
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 5, vocab, dtype=torch.float64, generator=generator, requires_grad=True)
    targets = torch.randint(0, vocab, (2, 5), generator=generator)
    targets[:, ::3] = PAD
    ours = chunked(logits, targets)
    theirs = F.cross_entropy(logits.view(-1, vocab), targets.view(-1), ignore_index=PAD, reduction="sum")
    assert torch.allclose(ours, theirs, rtol=1e-12)
    [ours_grad], [their_grad] = torch.autograd.grad(3 * ours, logits), torch.autograd.grad(3 * theirs, logits)
    assert torch.allclose(ours_grad, their_grad, rtol=1e-10, atol=1e-14)
    assert torch.autograd.gradcheck(lambda x: chunked(x, targets), (logits,))


def test_float32_logits_take_torchs_own_kernel_bit_for_bit():
    generator = torch.Generator().manual_seed(2)
    logits, targets = torch.randn(3, 7, 50, generator=generator), torch.randint(0, 50, (3, 7), generator=generator)
    targets[0, :2] = PAD
    assert torch.equal(summed_cross_entropy(logits, targets),
                       F.cross_entropy(logits.view(-1, 50), targets.view(-1), ignore_index=PAD, reduction="sum"))


def test_low_precision_logits_are_summed_in_float32_and_get_gradients_of_their_own_precision():
    generator = torch.Generator().manual_seed(1)
    wide = torch.randn(40, 100, generator=generator)
    targets = torch.randint(0, 100, (40,), generator=generator)
    narrow = wide.bfloat16().requires_grad_()
    loss = summed_cross_entropy(narrow, targets)
    assert loss.dtype == torch.float32
    assert torch.allclose(loss, F.cross_entropy(narrow.float(), targets, reduction="sum"), rtol=1e-6)
    loss.backward()
    assert narrow.grad.dtype == torch.bfloat16


def test_inside_a_compiled_step_low_precision_logits_take_torchs_kernel_widened_in_the_graph():
    """A compiled step hands the compiler torch's cross-entropy on the widened logits, whose widening it fuses, instead of
    the chunks' loops; the loss is torch's."""
    graphs: list[torch.fx.GraphModule] = []

    def recording(graph: torch.fx.GraphModule, _inputs: list) -> object:
        graphs.append(graph)
        return graph.forward

    generator = torch.Generator().manual_seed(3)
    narrow = torch.randn(24, 64, generator=generator).bfloat16().requires_grad_()
    targets = torch.randint(0, 64, (24,), generator=generator)
    targets[::5] = PAD
    torch._dynamo.reset()
    loss = torch.compile(summed_cross_entropy, backend=recording, fullgraph=True)(narrow, targets)
    [graph] = graphs
    assert F.cross_entropy in {node.target for node in graph.graph.nodes}
    assert torch.equal(loss, F.cross_entropy(narrow.float(), targets, ignore_index=PAD, reduction="sum"))
    loss.backward()
    assert narrow.grad.dtype == torch.bfloat16
