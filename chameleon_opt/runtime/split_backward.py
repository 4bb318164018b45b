"""A stage's backward split as Zero Bubble splits it: B (the stage input's gradient, which the
previous stage waits for) now, W (the weights' gradients, which nobody waits for) later, with no
part computed twice.

Why not simply W = `out.backward(grad, inputs=params)`: that walks the whole stage again,
recomputing every activation gradient B computed, so B + W would cost nearly two backwards
instead of the one the bubble schedule prices. Instead B records, on each autograd node of the
input's gradient path that also feeds parameters, the gradient that reached it (a pre-hook), and
W restarts autograd from exactly those nodes towards their own parameters only: each node's
weight-side outputs (a linear layer's dW and bias, a norm's scale and shift) are all W computes.
The kernels and their inputs are those of the full backward, so the gradients are bitwise equal.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch
from torch.autograd.graph import GradientEdge, Node, get_gradient_edge


def _children(node: Node) -> Iterator[Node]:
    return (child for child, _ in node.next_functions if child is not None)


def _post_order(root: Node) -> list[Node]:
    """Every node below `root`, each after all of its children (iterative: no recursion limit)."""
    order: list[Node] = []
    seen = {root}
    stack = [(root, _children(root))]
    while stack:
        node, pending = stack[-1]
        child = next(pending, None)
        if child is None:
            stack.pop()
            order.append(node)
        elif child not in seen:
            seen.add(child)
            stack.append((child, _children(child)))
    return order


def _weight_groups(root: Node, x_node: Node, param_of: dict[Node, torch.Tensor]
                   ) -> list[tuple[Node, list[torch.Tensor]]]:
    """The nodes on the input's gradient path that feed parameters, each with the parameters
    reached from it without passing through that path again."""
    order = _post_order(root)
    on_path: dict[Node, bool] = {}
    for node in order:
        on_path[node] = node is x_node or any(on_path[child] for child in _children(node))
    groups = []
    for node in order:
        if not on_path[node]:
            continue
        params: list[torch.Tensor] = []
        stack = [child for child in _children(node) if not on_path[child]]
        seen = set(stack)
        while stack:
            below = stack.pop()
            if below in param_of:
                params.append(param_of[below])
            for child in _children(below):
                if child not in seen and not on_path[child]:
                    seen.add(child)
                    stack.append(child)
        if params:
            groups.append((node, params))
    return groups


def split_backward(out: torch.Tensor, x: torch.Tensor | None, grad: torch.Tensor | None,
                   params: list[torch.Tensor]) -> tuple[torch.Tensor | None, Callable[[], None]]:
    """B now: the gradient of the stage input `x` (None for a first stage, which has none) for
    output gradient `grad` (None for a loss). Returns it with W, to call later: it accumulates the
    parameters' gradients into their `.grad` and releases the graph's buffers with itself."""
    if x is None:
        return None, lambda: out.backward(grad, inputs=params)
    assert out.grad_fn is not None
    param_of = {get_gradient_edge(p).node: p for p in params}
    groups = _weight_groups(out.grad_fn, get_gradient_edge(x).node, param_of)
    captured: dict[Node, tuple[torch.Tensor | None, ...]] = {}

    def hook_for(node: Node) -> Callable[[tuple[torch.Tensor | None, ...]], None]:
        def capture(grad_outputs: tuple[torch.Tensor | None, ...]) -> None:
            captured[node] = grad_outputs
        return capture

    handles = [node.register_prehook(hook_for(node)) for node, _ in groups]
    try:
        (x_grad,) = torch.autograd.grad(out, x, grad, retain_graph=True)
    finally:
        for handle in handles:
            handle.remove()

    def weights() -> None:
        for node, group in groups:
            reached = [(GradientEdge(node, k), g) for k, g in enumerate(captured.get(node, ())) if g is not None]
            if not reached:
                continue  # no gradient reached this node: the full backward gives its weights none either
            found = torch.autograd.grad([edge for edge, _ in reached], group, [g for _, g in reached],
                                        retain_graph=True, allow_unused=True)
            for p, g in zip(group, found):
                if g is not None:  # out of place: a gradient tensor may be shared by two parameters
                    p.grad = g if p.grad is None else p.grad + g
        captured.clear()

    return x_grad, weights
