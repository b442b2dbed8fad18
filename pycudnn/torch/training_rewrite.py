"""The training fusion pass: finds Conv-BN(-add)-ReLU chains in a model's fx graph and replaces
them with the fused blocks of `pycudnn.torch.training`, in place, keeping the state_dict.

A chain is fused only where the rewrite keeps its meaning: out-of-place adds (or an in-place add
into the batch norm's output), no in-place change of the convolution's input or the shortcut
between the first and last fused node, and no hooks on the modules fused. `revert` (via
`unfuse_training`) puts the original calls back.
"""

from __future__ import annotations

import copy
import inspect
import logging
import operator
from typing import Any

import torch
import torch.nn.functional as F

from ._types import ModuleT
from .conv_chains import CHAIN_BLOCKS, BnReLUConv2d, ConvStats2d, chainable
from .training import BLOCKS, ConvBn2d, ConvBnAddReLU2d, ConvBnReLU2d, has_hooks

log = logging.getLogger("pycudnn")
#: the dtypes a batch norm is kept in float32 for when its block is fused (its statistics)
_HALF = (torch.float16, torch.bfloat16)

__all__ = ["fuse_for_training", "unfuse_training"]

# ---- the rewrite --------------------------------------------------------------------------------

_RELU_FUNCTIONS = {F.relu, F.relu_, torch.relu, torch.relu_}
_ADD_FUNCTIONS = {operator.add, operator.iadd, torch.add}


def is_relu(node: Any, modules: dict[str, Any]) -> bool:
    """Whether fx ``node`` is a ReLU: ``nn.ReLU``, ``F.relu``/``torch.relu`` (``inplace`` or not)
    or ``.relu()`` (both fusion passes match the same spellings)."""
    if node.op == "call_module":
        return type(modules.get(node.target)) is torch.nn.ReLU
    if node.op == "call_function":
        return (node.target in _RELU_FUNCTIONS and len(node.args) + len(node.kwargs) <= 2
                and all(type(a) is bool for a in node.args[1:]) and set(node.kwargs) <= {"inplace"})
    return node.op == "call_method" and node.target in ("relu", "relu_") and len(node.args) == 1


def is_add(node: Any) -> bool:
    """Whether fx ``node`` adds two tensors: ``+``, ``+=``, ``torch.add`` or ``.add`` without
    ``alpha``."""
    if node.op == "call_function":
        return node.target in _ADD_FUNCTIONS and len(node.args) == 2 and not node.kwargs
    return (node.op == "call_method" and node.target in ("add", "add_") and len(node.args) == 2
            and not node.kwargs)


def add_fusable(add: Any, first: Any) -> bool:
    """Whether add node ``add`` (`is_add`) can become part of a fused block whose chain ends in
    ``first``: an out-of-place add, or an in-place one into ``first`` itself (``y += z``, whose
    result nothing else holds). ``z += y`` changes z, which the fused block would not."""
    inplace = add.target is operator.iadd or (add.op == "call_method" and add.target == "add_")
    return not inplace or add.args[0] is first


_INPLACE_OPERATORS = {operator.iadd, operator.isub, operator.imul, operator.itruediv,
                      operator.ifloordiv, operator.imod, operator.ipow, operator.imatmul,
                      operator.iand, operator.ior, operator.ixor, operator.ilshift,
                      operator.irshift, operator.iconcat, operator.setitem, operator.delitem}


def may_mutate(node: Any, modules: dict[str, Any]) -> bool:
    """Whether fx ``node`` may change a tensor in place (fx does not track mutation, so this
    errs on the safe side): a method or function whose name ends in ``_``, an ``operator.i*``
    or item assignment, ``out=``, ``inplace=True``, or a module with ``inplace=True``."""
    target = node.target
    if node.op == "call_method":
        return (target.endswith("_") and not target.endswith("__")) or (
            target.startswith("__i") and target.endswith("__")) or target in (
                "__setitem__", "__delitem__")
    if node.op == "call_module":
        return getattr(modules.get(target), "inplace", False) is True
    if node.op != "call_function":
        return False
    if target in _INPLACE_OPERATORS or "out" in node.kwargs or node.kwargs.get("inplace"):
        return True
    name = getattr(target, "__name__", "")
    if name.endswith("_") and not name.endswith("__"):
        return True
    try:
        bound = inspect.signature(target).bind(*node.args, **node.kwargs)
    except (TypeError, ValueError):  # a builtin without a signature, arguments it refuses
        return False
    return bound.arguments.get("inplace") is True


def mutation_between(first: Any, last: Any, chain: tuple[Any, ...],
                     modules: dict[str, Any]) -> Any:
    """The first node strictly between ``first`` and ``last`` (graph order), not in ``chain``,
    that may change a tensor in place, or None. A fused block runs at ``last``'s position: an
    in-place change of its input or shortcut in between would be seen by it."""
    node = first.next
    while node is not last and node.op != "root":
        if node not in chain and may_mutate(node, modules):
            return node
        node = node.next
    return None


def module_calls(graph: Any) -> list[Any]:
    """The ``call_module`` nodes of an fx graph, in graph order: a list taken before a pass
    changes the graph (the nodes it adds are not visited)."""
    return [node for node in graph.nodes if node.op == "call_module"]


_AUGMENTED = ("iadd", "isub", "imul", "itruediv", "ifloordiv", "imod", "ipow", "imatmul", "iand",
              "ior", "ixor", "ilshift", "irshift")
_inplace_tracer: Any = None


def inplace_tracer() -> Any:
    """A ``torch.fx.Tracer`` class whose proxies record ``z += y`` (and the other augmented
    assignments) as the in-place operator: fx's own proxies record ``z + y``, and an alias of
    ``z`` would then not see the change (both fusion passes trace with it)."""
    global _inplace_tracer
    if _inplace_tracer is None:
        import torch.fx

        class InplaceProxy(torch.fx.Proxy):
            pass

        def recorder(op: Any) -> Any:
            def augmented(self: Any, other: Any) -> Any:
                return self.tracer.create_proxy("call_function", op, (self, other), {})
            return augmented

        for name in _AUGMENTED:
            setattr(InplaceProxy, f"__{name}__", recorder(getattr(operator, name)))

        class InplaceTracer(torch.fx.Tracer):
            def proxy(self, node: Any) -> Any:
                return InplaceProxy(node, self)

        _inplace_tracer = InplaceTracer
    return _inplace_tracer


def fx_tracer() -> Any:
    """fx's tracer with pycudnn's modules as leaves. Public as a seam for tests and tooling."""
    class Tracer(inplace_tracer()):  # type: ignore[misc]
        """fx's tracer with pycudnn's modules as leaves (like torch.nn's own)."""

        def is_leaf_module(self, m: Any, qualname: str) -> bool:
            return (type(m).__module__.startswith("pycudnn.torch")
                    or super().is_leaf_module(m, qualname))

    return Tracer()


def _half_batchnorm_to_float32(bn: torch.nn.BatchNorm2d) -> None:
    """cuDNN's batch norm over float16/bfloat16 data takes float32 scale, shift and statistics
    (as PyTorch's cuDNN batch norm does): the same parameter and buffer objects, in float32."""
    for t in (bn.weight, bn.bias, bn.running_mean, bn.running_var):
        if t is not None and t.dtype in _HALF:
            t.data = t.data.float()


def _target(root: Any, target: str) -> Any:
    try:
        return root.get_submodule(target)
    except AttributeError:
        return None


def _free_name(root: Any, base: str, taken: set[str]) -> str:
    """``base`` (or ``base2``, ...) where no attribute of its parent module is: a block of an
    earlier fusion that the graph does not call (``taken``: what it calls and the blocks made
    now), as in a model pickled unfused, gives its name back."""
    name, again = base, 1
    while True:
        prefix, _, leaf = name.rpartition(".")
        parent = root.get_submodule(prefix) if prefix else root
        held = parent._modules.get(leaf)
        if name not in taken and (isinstance(held, _ALL_BLOCKS)
                                 or (held is None and not hasattr(parent, leaf))):
            return name
        again += 1
        name = f"{base}{again}"


_ALL_BLOCKS = BLOCKS + CHAIN_BLOCKS


def _register(module: Any, name: str, block: Any) -> None:
    prefix, _, leaf = name.rpartition(".")
    (module.get_submodule(prefix) if prefix else module).add_module(leaf, block)


def _rewrite(gm: Any, root: Any) -> int:
    """Fuse the chains of ``gm``'s graph in place, ``gm`` traced from ``root`` (``gm`` itself for
    a GraphModule), registering the blocks in both; the number of blocks made."""
    import torch.fx

    modules = {name: m for name, m in root.named_modules(remove_duplicate=False)}
    graph = gm.graph
    made: set[str] = set()
    calls = module_calls(graph)
    taken = {n.target for n in calls}
    for node in calls:
        if len(node.args) != 1 or node.kwargs:
            continue
        conv = modules.get(node.target)
        if not isinstance(conv, torch.nn.Conv2d) or type(conv).__module__ not in (
                "torch.nn.modules.conv", "pycudnn.torch.modules") or conv.padding_mode != "zeros":
            continue
        users = list(node.users)
        if len(users) != 1 or users[0].op != "call_module":
            continue
        bn_node = users[0]
        bn: Any = modules.get(bn_node.target)
        if type(bn) is not torch.nn.BatchNorm2d or not bn.affine \
                or bn.num_features != conv.out_channels or len(bn_node.args) != 1:
            continue
        if has_hooks(conv) or has_hooks(bn):
            log.debug("fuse_for_training: %s -> %s not fused: the modules have hooks",
                      node.target, bn_node.target)
            continue
        after = list(bn_node.users)
        relu_node = add_node = z = None
        cls: type[torch.nn.Module] = ConvBn2d
        if len(after) == 1 and is_relu(after[0], modules):
            relu_node, cls = after[0], ConvBnReLU2d
        elif len(after) == 1 and is_add(after[0]) and add_fusable(after[0], bn_node):
            add = after[0]
            other = add.args[1] if add.args[0] is bn_node else add.args[0]
            then = list(add.users)
            if (isinstance(other, torch.fx.Node) and other is not bn_node and len(then) == 1
                    and is_relu(then[0], modules)):
                add_node, relu_node, z, cls = add, then[0], other, ConvBnAddReLU2d
        if relu_node is not None and relu_node.op == "call_module" \
                and has_hooks(modules[relu_node.target]):
            relu_node = add_node = z = None
            cls = ConvBn2d
        chain = (node, bn_node, add_node, relu_node)
        changer = None if relu_node is None else mutation_between(node, relu_node, chain, modules)
        if changer is not None:
            log.debug("fuse_for_training: %s: only the batch norm fused: %s may change a tensor "
                      "in place before the ReLU", node.target, changer)
            relu_node = add_node = z = None
            cls = ConvBn2d
        if mutation_between(node, bn_node, chain, modules):
            continue
        _half_batchnorm_to_float32(bn)
        block = cls(conv, bn, node.target, bn_node.target)
        name = _free_name(root, f"{node.target}_"
                          f"{'bn_add_relu' if add_node else 'bn_relu' if relu_node else 'bn'}",
                          taken)
        made.add(name)
        taken.add(name)
        modules[name] = block
        if gm is not root:
            _register(root, name, block)
        gm.add_submodule(name, block)
        last = relu_node if relu_node is not None else bn_node
        with graph.inserting_after(last):
            new = graph.call_module(name, (node.args[0],) if z is None else (node.args[0], z))
        last.replace_all_uses_with(new)
        for dead in (relu_node, add_node, bn_node, node):
            if dead is not None:
                graph.erase_node(dead)
    if made:
        graph.lint()
        gm.recompile()
    return len(made)


def _chain_links(graph: Any, modules: dict[str, Any]) -> list[tuple[Any, Any, Any, Any]]:
    """The ``conv -> bn -> relu -> conv`` links of an fx graph whose batch norm can live in the
    convolutions (`conv_chains`): each output used only by the next step, no hooks, a training
    batch norm whose step the finalize graph computes, nothing in between that may change a
    tensor in place."""
    links = []
    for node in module_calls(graph):
        conv: Any = modules.get(node.target)
        if len(node.args) != 1 or node.kwargs or not chainable(conv) or type(conv).__module__ \
                not in ("torch.nn.modules.conv", "pycudnn.torch.modules") or has_hooks(conv):
            continue
        users = list(node.users)
        if len(users) != 1 or users[0].op != "call_module" or len(users[0].args) != 1:
            continue
        bn_node = users[0]
        bn: Any = modules.get(bn_node.target)
        if type(bn) is not torch.nn.BatchNorm2d or not bn.affine or not bn.track_running_stats \
                or bn.momentum is None or bn.num_features != conv.out_channels or has_hooks(bn):
            continue
        after = list(bn_node.users)
        if len(after) != 1 or not is_relu(after[0], modules):
            continue
        relu_node = after[0]
        if relu_node.op == "call_module" and has_hooks(modules[relu_node.target]):
            continue
        then = list(relu_node.users)
        if len(then) != 1 or then[0].op != "call_module" or then[0].args != (relu_node,) \
                or then[0].kwargs:
            continue
        nxt: Any = modules.get(then[0].target)
        if not chainable(nxt) or type(nxt).__module__ not in (
                "torch.nn.modules.conv", "pycudnn.torch.modules") or has_hooks(nxt) \
                or nxt.in_channels != bn.num_features:
            continue
        chain = (node, bn_node, relu_node, then[0])
        if mutation_between(node, then[0], chain, modules) is not None:
            continue
        links.append(chain)
    return links


def _rewrite_chains(gm: Any, root: Any) -> int:
    """Put `ConvStats2d` and `BnReLUConv2d` in place of ``gm``'s chain links (`_chain_links`),
    registering them in ``gm`` and ``root`` as `_rewrite` does its blocks; the number made."""
    modules = {name: m for name, m in root.named_modules(remove_duplicate=False)}
    graph = gm.graph
    links = _chain_links(graph, modules)
    if not links:
        return 0
    heads = {link[0]: link for link in links}  # a convolution whose output feeds a chain link
    tails = {link[3]: link for link in links}  # a convolution reading through a batch norm
    taken = {n.target for n in module_calls(graph)}
    made: dict[Any, Any] = {}  # old convolution node -> the node giving its (y, sums, sqsums)
    count = 0
    for node in [n for n in graph.nodes if n in heads or n in tails]:
        conv = modules[node.target]
        head, tail = heads.get(node), tails.get(node)
        if tail is not None:
            bn_node = tail[1]
            bn = modules[bn_node.target]
            block: Any = BnReLUConv2d(bn, conv, head is not None, bn_node.target, node.target)
            args: tuple[Any, ...] = (made[tail[0]],)
            base = f"{bn_node.target}_relu_{node.target.rpartition('.')[2]}"
        else:
            assert head is not None  # the node is a head or a tail
            block = ConvStats2d(conv, modules[head[1].target], node.target)
            args = node.args
            base = f"{node.target}_stats"
        if head is not None:
            _half_batchnorm_to_float32(modules[head[1].target])
        name = _free_name(root, base, taken)
        taken.add(name)
        modules[name] = block
        if gm is not root:
            _register(root, name, block)
        gm.add_submodule(name, block)
        with graph.inserting_before(node):
            new = graph.call_module(name, args)
        count += 1
        if head is not None:
            made[node] = new
        else:
            node.replace_all_uses_with(new)
    dead = {n for link in links for n in link}  # a middle convolution is in two links
    for node in reversed([n for n in graph.nodes if n in dead]):  # users first
        graph.erase_node(node)
    graph.lint()
    gm.recompile()
    return count


def _reduce_unfused(self: Any, protocol: int) -> Any:
    # pickled as the model's own class: pickle cannot name the generated forward, so a pickled
    # model loads unfused (fuse_for_training fuses it again)
    return (_new_instance, (type(self).__dict__["_pycudnn_unfused"],), self.__getstate__())


def _new_instance(cls: Any) -> Any:
    """``cls.__new__(cls)`` (what pickle's ``copyreg.__newobj__`` does)."""
    return cls.__new__(cls)


def _deepcopy_fused(self: Any, memo: dict[int, Any]) -> Any:
    new = _new_instance(type(self))
    memo[id(self)] = new
    new.__setstate__(copy.deepcopy(self.__getstate__(), memo))
    return new


def _copy_fused(self: Any) -> Any:
    new = _new_instance(type(self))
    new.__setstate__(self.__getstate__())
    return new


def _install(module: Any, gm: Any) -> None:
    """Give ``module`` the rewritten graph's ``forward``: its class becomes a subclass of its own
    class (the same object, methods, hooks, parameters, buffers and their persistence)."""
    base = type(module).__dict__.get("_pycudnn_unfused") or type(module)
    module.__class__ = type(base.__name__, (base,), {
        "forward": type(gm).forward, "__module__": base.__module__,
        "__qualname__": base.__qualname__, "__doc__": base.__doc__, "_pycudnn_unfused": base,
        "__reduce_ex__": _reduce_unfused, "__deepcopy__": _deepcopy_fused,
        "__copy__": _copy_fused})


def _fuse(module: Any, into_convolutions: bool = False) -> int:
    """Fuse ``module`` in place; the number of blocks made."""
    import torch.fx

    if isinstance(module, torch.fx.GraphModule):
        return (_rewrite_chains(module, module) if into_convolutions else 0) + _rewrite(
            module, module)
    try:
        gm = torch.fx.GraphModule(module, fx_tracer().trace(module), type(module).__name__)
    except Exception:  # dynamic control flow, ...: look inside its children instead
        return sum(_fuse(child, into_convolutions) for child in list(module.children()))
    n = (_rewrite_chains(gm, module) if into_convolutions else 0) + _rewrite(gm, module)
    if n:
        _install(module, gm)
    return n


def fuse_for_training(model: ModuleT, *, into_convolutions: bool = False) -> ModuleT:
    """Fuse ``model``'s Conv-BN chains into training blocks (`ConvBn2d`, `ConvBnReLU2d`,
    `ConvBnAddReLU2d`), in place; returns ``model``.

    The model is traced with ``torch.fx``; these chains are recognised (``conv`` a
    ``torch.nn.Conv2d`` or `pycudnn.torch.Conv2d` with ``padding_mode="zeros"``, ``bn`` an affine
    ``torch.nn.BatchNorm2d`` with its channel count, each output used only by the next step; ReLU
    as ``nn.ReLU``, ``F.relu``, ``torch.relu`` or ``.relu()``; the add as ``+``, ``torch.add``,
    ``.add``, or ``y += z`` / ``y.add_(z)`` into the batch norm's output):

    * ``conv -> bn -> relu``: `ConvBnReLU2d`;
    * ``conv -> bn -> add(other) -> relu``: `ConvBnAddReLU2d`, ``forward(x, other)``;
    * ``conv -> bn`` otherwise: `ConvBn2d` (the ReLU-less chains, the shortcut's batch norm).

    Left as they are: modules with forward or backward hooks (so ``torch.nn.utils.prune``, the
    old ``weight_norm`` and ``spectral_norm``); the add and ReLU of a chain where a step between
    the convolution and the ReLU may change a tensor in place (the block runs at the ReLU's
    place); what matches no chain. A part of the model that fx cannot trace is searched module
    by module. Hooks added to a fused convolution or batch norm later make its block run the
    original modules.

    ``model`` keeps its identity, class (a subclass of it whose ``forward`` is the fused graph's
    code), methods, parameters, buffers (persistent or not) and ``state_dict`` keys; the blocks
    own nothing and sit beside the convolutions. Pickling the whole model stores it unfused
    (``state_dict`` is the usual way); deep copies stay fused.

    Half precision: the fused kernels take float32 scale, shift and statistics, so a fused batch
    norm whose parameters are float16/bfloat16 has them made float32 in place (the same
    ``Parameter`` objects: call this before an optimizer creates its state for them).

    Training mode runs the fused kernels (channels-last float16/bfloat16, channels a multiple of
    4; other calls run the original modules); eval mode runs the original modules (for inference,
    `fuse_for_inference` folds the batch norms). ``revert`` turns the blocks back into the plain
    modules' calls.

    ``into_convolutions=True`` first fuses each batch norm that sits between two convolutions
    (``conv -> bn -> relu -> conv``, both convolutions without groups or bias, the batch norm
    with a fixed ``momentum``) into those convolutions instead (`ConvStats2d`, `BnReLUConv2d`:
    the first convolution also sums its output per channel, the second reads its input through
    the batch norm and the ReLU, so the normalized activation is never written: NVIDIA's ResNet
    training scheme); the rest is fused into blocks as above. Off by default: not yet measured
    against the blocks on a GPU.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"fuse_for_training: expected a torch.nn.Module, got "
                        f"{type(model).__name__}")
    if not isinstance(into_convolutions, bool):
        raise TypeError(f"fuse_for_training: into_convolutions must be a bool, got "
                        f"{into_convolutions!r}")
    _fuse(model, into_convolutions)
    return model


def unfuse_training(module: Any) -> Any:
    """Turn every training block in ``module`` back into its modules' plain calls (in place);
    returns ``module``. `revert` calls this."""
    import torch.fx

    for gm in [m for m in module.modules() if isinstance(m, torch.fx.GraphModule)]:
        graph = gm.graph
        changed = False
        for node in module_calls(graph):
            block = gm.get_submodule(node.target)
            if isinstance(block, CHAIN_BLOCKS):
                # unfused, a chain module's (y, sums, sqsums) is the convolution's output y
                with graph.inserting_before(node):
                    v = node.args[0]
                    if isinstance(block, BnReLUConv2d):
                        v = graph.call_function(torch.relu, (graph.call_module(block.bn_name,
                                                                               (v,)),))
                    v = graph.call_module(block.conv_name, (v,))
                node.replace_all_uses_with(v)
                graph.erase_node(node)
                changed = True
                continue
            if not isinstance(block, BLOCKS):
                continue
            with graph.inserting_before(node):
                v = graph.call_module(block.conv_name, (node.args[0],))
                v = graph.call_module(block.bn_name, (v,))
                if isinstance(block, ConvBnAddReLU2d):
                    v = graph.call_function(operator.add, (v, node.args[1]))
                if not isinstance(block, ConvBn2d):
                    v = graph.call_function(torch.relu, (v,))
            node.replace_all_uses_with(v)
            graph.erase_node(node)
            changed = True
        if changed:
            graph.lint()
            gm.recompile()
    for m in list(module.modules()):
        base = type(m).__dict__.get("_pycudnn_unfused")
        if base is not None:
            m.__class__ = base
    for m in list(module.modules()):
        for name in [k for k, v in m._modules.items() if isinstance(v, _ALL_BLOCKS)]:
            del m._modules[name]
    return module
