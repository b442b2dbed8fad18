"""Inference fusion: BatchNorm folded into the convolution before it, and Conv-BN-ReLU /
Conv-BN-add-ReLU rewritten (torch.fx) into ``FusedConv2d`` blocks."""

from __future__ import annotations

import copy
from typing import Any

import torch

from .modules import CONVERSIONS, Conv2d, FusedConv2d, log
from .training import has_hooks
from .training_rewrite import (add_fusable, inplace_tracer, is_add, is_relu, module_calls,
                               mutation_between)


# ---- inference fusion -----------------------------------------------------------------------------

def fold_batchnorm(conv: torch.nn.Conv2d, bn: torch.nn.BatchNorm2d) -> tuple[torch.Tensor, torch.Tensor]:
    """``(weight, bias)`` of one convolution equal to ``bn(conv(x))`` with ``bn`` in eval mode
    (its running statistics), computed in float64 and returned in the convolution's dtype and
    memory format."""
    if bn.running_mean is None or bn.running_var is None:
        raise ValueError("fold_batchnorm: the BatchNorm keeps no running statistics "
                         "(track_running_stats=False); it cannot be folded")
    w = conv.weight.detach()
    scale = bn.running_var.detach().double().add(bn.eps).rsqrt()
    if bn.weight is not None:
        scale = scale * bn.weight.detach().double()
    shift = -bn.running_mean.detach().double() * scale
    if conv.bias is not None:
        shift = shift + conv.bias.detach().double() * scale
    if bn.bias is not None:
        shift = shift + bn.bias.detach().double()
    folded = torch.empty_like(w)  # keeps the weight's memory format
    folded.copy_(w.double() * scale.view(-1, 1, 1, 1))
    return folded, shift.to(w.dtype)


def fuse_for_inference(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of ``model`` (in eval mode) for inference, with BatchNorm folded into the
    convolutions before it and fused pycudnn calls for the epilogues.

    The model is traced with ``torch.fx``; these patterns are recognised (``conv`` a
    ``torch.nn.Conv2d`` or `pycudnn.torch.Conv2d` with
    ``padding_mode="zeros"``, ``bn`` a ``torch.nn.BatchNorm2d`` with running statistics, each
    output used only by the next step; ReLU as ``nn.ReLU``, ``F.relu``, ``torch.relu`` or
    ``.relu()``; the add as ``+``, ``torch.add`` or ``.add`` without ``alpha``, or ``y += z`` /
    ``y.add_(z)`` into the previous step's output):

    * ``conv -> [bn] -> relu``: one `conv2d_bias_relu`;
    * ``conv -> [bn] -> add(other) -> relu``: one `conv2d_add_relu`
      with ``z = other`` (a ResNet block's last convolution and its shortcut);
    * ``conv -> [bn]`` otherwise: one convolution with the folded bias.

    Left as they are: modules with forward or backward hooks (``torch.nn.utils.prune``, the old
    ``weight_norm`` and ``spectral_norm``), the add and ReLU where a step between the
    convolution and the ReLU may change a tensor in place, and what matches no pattern. A part
    of the model that fx cannot trace is searched module by module instead. The result is a copy (``model`` itself when nothing matched): a
    ``torch.fx.GraphModule``, or a copy of ``model``'s own class where fx could not trace it as
    a whole; the original model is not modified and shares no parameters with it. A convolution
    module called more than once is fused separately for each call.

    In benchmark mode (``torch.backends.cudnn.benchmark``) each fused call's first run of a new
    input signature times it against PyTorch's operations for it (the convolution with the
    folded bias, then the add and ReLU) and runs the faster from then on, as converted
    convolutions are routed (`routing_report()` lists the decisions).

    Raises:
        ValueError: the model is in training mode (BatchNorm's batch statistics cannot be folded).
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"fuse_for_inference: expected a torch.nn.Module, got "
                        f"{type(model).__name__}")
    if model.training:
        raise ValueError("fuse_for_inference: the model is in training mode; call model.eval() "
                         "first (BatchNorm is folded with its running statistics)")
    # a copy: the parts fx cannot trace are rewritten in place, and the fused modules must not
    # share weights with a model that may go on training
    fused = _fuse(copy.deepcopy(model))
    return model if fused is None else fused




def _fuse(module: Any) -> Any | None:
    """``module`` with its patterns fused: a GraphModule, or ``module`` itself with fused
    children where fx cannot trace it; None where nothing matched."""
    import torch.fx

    class Tracer(inplace_tracer()):  # type: ignore[misc]
        """fx's tracer (in-place operators kept), with pycudnn's modules as leaves (like torch.nn's own): tracing into
        ``Conv2d._conv_forward`` would stop at its device test."""

        def is_leaf_module(self, m: Any, qualname: str) -> bool:
            return (isinstance(m, (FusedConv2d, *CONVERSIONS.values()))
                    or super().is_leaf_module(m, qualname))

    try:
        gm = torch.fx.GraphModule(module, Tracer().trace(module), type(module).__name__)
    except Exception:  # dynamic control flow, ...: look inside its children instead
        changed = False
        for name, child in list(module.named_children()):
            fused = _fuse(child)
            if fused is not None:
                setattr(module, name, fused)
                changed = True
        return module if changed else None
    return gm if _rewrite(gm) else None


def _users(node: Any) -> list[Any]:
    return list(node.users)


def _rewrite(gm: Any) -> bool:
    """Fuse the patterns in ``gm``'s graph (in place); whether anything changed."""
    import torch.fx

    modules = dict(gm.named_modules())
    graph = gm.graph
    changed = False
    for node in module_calls(graph):
        conv = modules.get(node.target)
        if conv is None or type(conv) not in (torch.nn.Conv2d, Conv2d) \
                or conv.padding_mode != "zeros":
            continue
        if len(node.args) != 1 or node.kwargs:
            continue
        if has_hooks(conv):
            log.debug("fuse_for_inference: %s not fused: it has hooks", node.target)
            continue
        weight, bias = conv.weight.detach(), None if conv.bias is None else conv.bias.detach()
        tail = node
        users = _users(node)
        if (len(users) == 1 and users[0].op == "call_module"
                and type(modules.get(users[0].target)) is torch.nn.BatchNorm2d
                and modules[users[0].target].running_mean is not None
                and not mutation_between(node, users[0], (node, users[0]), modules)):
            if has_hooks(modules[users[0].target]):
                log.debug("fuse_for_inference: %s not folded: it has hooks", users[0].target)
            else:
                weight, bias = fold_batchnorm(conv, modules[users[0].target])
                tail = users[0]
        users = _users(tail)
        relu_node = add_node = z = None
        if len(users) == 1 and is_relu(users[0], modules):
            relu_node = users[0]
        elif len(users) == 1 and is_add(users[0]) and add_fusable(users[0], tail):
            add = users[0]
            other = add.args[1] if add.args[0] is tail else add.args[0]
            after = _users(add)
            if (isinstance(other, torch.fx.Node) and other is not tail and len(after) == 1
                    and is_relu(after[0], modules)):
                add_node, relu_node, z = add, after[0], other
        # the ReLU (and the add) stay where the ReLU module has hooks, or where a step between
        # the convolution and the ReLU may change a tensor in place (the fused call runs at the
        # ReLU's place)
        if relu_node is not None and (
                (relu_node.op == "call_module" and has_hooks(modules[relu_node.target]))
                or mutation_between(node, relu_node, (node, tail, add_node, relu_node), modules)):
            relu_node = add_node = z = None
        if tail is node and relu_node is None:
            continue  # a lone convolution: nothing to fuse
        fused = FusedConv2d(weight, bias, conv.stride, conv.padding, conv.dilation, conv.groups,
                            relu=relu_node is not None, residual=add_node is not None)
        name = base = f"{node.target}_fused"  # beside the convolution it replaces
        again = 1
        while name in modules:  # the same convolution called again: a name per call
            again += 1
            name = f"{base}{again}"
        modules[name] = fused
        gm.add_submodule(name, fused)
        last = relu_node if relu_node is not None else tail
        with graph.inserting_after(last):
            args = (node.args[0],) if z is None else (node.args[0], z)
            new = graph.call_module(name, args)
        last.replace_all_uses_with(new)
        for dead in dict.fromkeys((relu_node, add_node, tail, node)):  # last first, once each
            if dead is not None:
                graph.erase_node(dead)
        changed = True
    if changed:
        graph.lint()
        gm.delete_all_unused_submodules()
        gm.recompile()
    return changed
