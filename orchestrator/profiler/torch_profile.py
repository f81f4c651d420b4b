"""Profile ``FACTORY(batch) -> (nn.Module, inputs)`` on the meta device: per-layer work by op class.

Every ATen op of one forward + backward pass is intercepted (a ``TorchDispatchMode``) and charged to the
innermost module running it (``torch.utils.module_tracker.ModuleTracker``, which also follows the
backward pass): FLOPs from PyTorch's own formulas (``torch.utils.flop_counter``) for matmuls and
convolutions ("tensor"), one FLOP an output element for element-wise ops and ~8 for normalizations
("vector"), none for data movement ("memory"); bytes are every non-view op's inputs plus outputs.
Activation memory is what autograd saves (``saved_tensors_hooks``). The model is built and run twice, at
batches 2 and 4: per-example figures are the difference / 2, so work that does not grow with the batch
(weights read, buffers) cancels and stays out of the per-example numbers. Nothing is allocated: the
meta device only propagates shapes, so ResNet-50 profiles in about a second on a CPU.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.costmodel.profiles.model import Layer, ModelProfile, OpWork, Variable
from orchestrator.profiler.factory_ref import EXAMPLE, FactorySource, foreign_module, refused, resolve_factory
from orchestrator.profiler.factory_ref import ProfileError as ProfileError  # re-exported: its users import it here

PROFILER_VERSION = 5  # 3: grouped convs' weight gradient per group; 4: ties between layers broken by name;
# 5: depthwise convolutions marked
BATCHES = (2, 4)
NORM_FLOPS_PER_ELEMENT = 8  # mean, variance, normalise, scale, shift (as profiles/layers.py)
SOFTMAX_FLOPS_PER_ELEMENT = 5
NORM_OPS = frozenset({
    "native_batch_norm", "native_batch_norm_backward", "_native_batch_norm_legit",
    "_native_batch_norm_legit_functional", "native_layer_norm", "native_layer_norm_backward",
    "native_group_norm", "native_group_norm_backward", "_fused_rms_norm", "_fused_rms_norm_backward",
})
SOFTMAX_OPS = frozenset({"_softmax", "_safe_softmax", "_log_softmax", "_softmax_backward_data",
                         "_log_softmax_backward_data"})
MEMORY_OPS = frozenset({
    "copy_", "_to_copy", "clone", "cat", "stack", "_unsafe_view", "contiguous", "constant_pad_nd",
    "max_pool2d_with_indices", "max_pool2d_with_indices_backward", "avg_pool2d", "avg_pool2d_backward",
    "_adaptive_avg_pool2d", "_adaptive_avg_pool2d_backward", "embedding", "embedding_dense_backward",
    "index_select", "gather", "scatter", "scatter_add", "index_put_", "index", "_unsafe_index",
    "select_backward", "slice_backward", "index_select_backward", "new_zeros", "zeros_like", "zero_",
    "fill_", "ones_like", "masked_fill", "where", "repeat", "expand_copy", "roll", "flip",
})
FREE_OPS = frozenset({"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "detach",
                      "lift_fresh", "alias", "_local_scalar_dense"})
KIND_BY_MODULE = {  # the cost model's layer kinds (compute.KERNELS) by module class name prefix
    "Conv": "conv", "Linear": "dense", "BatchNorm": "batchnorm", "LayerNorm": "layernorm",
    "GroupNorm": "layernorm", "RMSNorm": "layernorm", "ReLU": "relu", "GELU": "relu", "SiLU": "relu",
    "Embedding": "embedding", "MaxPool": "maxpool", "AvgPool": "avgpool", "AdaptiveAvgPool": "avgpool",
    "MultiheadAttention": "matmul", "LSTM": "matmul", "GRU": "matmul", "Dropout": "relu",
}


Factory = Callable[[int], Any]


@dataclass(frozen=True)
class FactoryRef:
    ref: str  # what the user wrote: MODULE:FACTORY
    factory: Factory
    fingerprint: str  # content of what defines the model (module source, or the library's version)


def _torchvision(src: FactorySource) -> FactoryRef:
    try:
        import torchvision  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        raise ProfileError(
            f"torchvision is not installed: install it, or use the torch.nn-only factory {EXAMPLE}"
        ) from None
    try:
        builder = torchvision.models.get_model_builder(src.name)
    except ValueError:
        raise ProfileError(f"torchvision has no model '{src.name}'") from None

    def build(batch: int) -> Any:
        import torch  # lazy: torch is an optional extra (heavy import)

        return builder(weights=None), (torch.randn(batch, 3, 224, 224),)

    return FactoryRef(src.ref, build, src.fingerprint)


@contextmanager
def _on_path(folder: Path) -> Iterator[None]:
    sys.path.insert(0, str(folder))
    try:
        yield
    finally:
        sys.path.remove(str(folder))


def load_factory(ref: str, base: Path | None = None) -> FactoryRef:
    """``MODULE:FACTORY`` (see ``factory_ref.resolve_factory``) imported: this runs the user's module, so only
    the profiling child (``sandbox``) and tests call it, never the controller."""
    return import_factory(resolve_factory(ref, base))


def _import_module(src: FactorySource) -> Any:
    if src.kind == "file":
        path = Path(src.path)
        spec = importlib.util.spec_from_file_location(f"_factory_{src.fingerprint[:12]}", path)
        if spec is None or spec.loader is None:
            raise ProfileError(f"cannot load {path} as a Python module")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod  # as an import would (dataclasses and pickling look it up there)
        with _on_path(path.parent):
            spec.loader.exec_module(mod)
        return mod
    with _on_path(Path(src.root)):
        mod = importlib.import_module(src.module)
    found = getattr(mod, "__file__", None)
    if not found or Path(found).resolve() != Path(src.path):  # what the cache key was made of
        raise ProfileError(f"'{src.module}' was imported from {found or 'no file'}, not {src.path} (from '{src.ref}')")
    return mod


def import_factory(src: FactorySource) -> FactoryRef:
    """Import ``src``'s module and take its factory, refused if the callable itself is not the user's own
    (``from os import system as build``: a builtin or standard-library function)."""
    if src.kind == "torchvision":
        return _torchvision(src)
    try:
        mod = _import_module(src)
    except ProfileError:
        raise
    except Exception as exc:  # the user's module: any import error is theirs to fix
        raise ProfileError(f"cannot import '{src.module}' (from '{src.ref}'): {type(exc).__name__}: {exc}") from None
    factory = getattr(mod, src.name, None)
    if not callable(factory):
        raise ProfileError(f"'{src.module}' has no callable '{src.name}' (from '{src.ref}')")
    owner = getattr(factory, "__module__", None)
    if not isinstance(owner, str):
        raise refused(src.ref, f"{src.name} does not say which module defines it")
    if (why := foreign_module(owner)) is not None:
        raise refused(src.ref, f"{src.name} is {owner}.{getattr(factory, '__qualname__', src.name)}: {why}")
    return FactoryRef(src.ref, factory, src.fingerprint)


def _nbytes(tree: Any) -> int:
    import torch  # lazy: torch is an optional extra (heavy import)
    from torch.utils._pytree import tree_leaves  # lazy: torch is an optional extra (heavy import)

    return sum(t.numel() * t.element_size() for t in tree_leaves(tree) if isinstance(t, torch.Tensor))


def _numel(tree: Any) -> int:
    import torch  # lazy: torch is an optional extra (heavy import)
    from torch.utils._pytree import tree_leaves  # lazy: torch is an optional extra (heavy import)

    return sum(t.numel() for t in tree_leaves(tree) if isinstance(t, torch.Tensor))


@dataclass
class _Pass:
    """What one forward + backward pass did, by layer (innermost module's name)."""

    order: dict[str, int] = field(default_factory=dict)
    work: dict[tuple[str, str], list[float]] = field(default_factory=lambda: defaultdict(lambda: [0.0, 0.0, 0.0]))
    fwd: dict[str, list[float]] = field(default_factory=lambda: defaultdict(lambda: [0.0, 0.0, 0.0, 0.0]))
    saved: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)


def _classify(packet: Any, args: Any, kwargs: dict[str, Any], out: Any) -> tuple[str, float]:
    from torch.utils.flop_counter import flop_registry  # lazy: torch is an optional extra (heavy import)

    if packet.__name__ == "convolution_backward" and len(args) > 10 and int(args[9]) > 1:
        return "tensor", _grouped_conv_backward_flops(args)
    if packet in flop_registry:
        return "tensor", float(flop_registry[packet](*args, **kwargs, out_val=out))
    name = packet.__name__
    if name in MEMORY_OPS:
        return "memory", 0.0
    per = NORM_FLOPS_PER_ELEMENT if name in NORM_OPS else SOFTMAX_FLOPS_PER_ELEMENT if name in SOFTMAX_OPS else 1
    return "vector", float(per * _numel(out))


def _grouped_conv_backward_flops(args: Any) -> float:
    """torch's formula counts a grouped convolution's weight gradient as a dense one (x groups: 960x
    for a depthwise layer); it costs the forward's FLOPs, as the input gradient does."""
    from torch.utils.flop_counter import conv_flop_count  # lazy: torch is an optional extra (heavy import)

    grad_out, x, w = (list(t.shape) for t in args[:3])
    transposed, mask = bool(args[7]), args[10]
    grad_in = conv_flop_count(grad_out, w, x, not transposed) if mask[0] else 0
    grad_w = conv_flop_count(x, w, grad_out, transposed) if mask[1] else 0
    return float(grad_in + grad_w)


def _run_pass(ref: FactoryRef, batch: int) -> tuple[_Pass, Any]:
    import torch  # lazy: torch is an optional extra (heavy import)
    from torch.utils.module_tracker import ModuleTracker  # lazy: torch is an optional extra (heavy import)

    record = _Pass()
    tracker = ModuleTracker()

    def layer() -> str:
        # deepest module; a tie (siblings both open in backward) broken by name, not by set order
        name = max(tracker.parents, key=lambda n: (n != "Global", n.count("."), n))
        name = name.split(".", 1)[1] if "." in name else "(model)"
        record.order.setdefault(name, len(record.order))
        return name

    def pack(t: Any) -> Any:
        if not isinstance(t, torch.nn.Parameter):
            record.saved[layer()] += t.numel() * t.element_size()
        return t

    try:
        with torch.device("meta"):
            built = ref.factory(batch)
        model, inputs = built
        if not isinstance(model, torch.nn.Module) or not isinstance(inputs, tuple):
            raise ProfileError(f"{ref.ref}(batch) must return (torch.nn.Module, tuple of inputs)")
        model.train()
        names = {id(m): n for n, m in model.named_modules()}
        hooks = [m.register_forward_hook(_shape_hook(record, names[id(m)])) for m in model.modules()
                 if not list(m.children())]
        saving = torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)
        with tracker, _recorder(record, tracker, layer), saving:
            out = model(*inputs)
            leaves = [t for t in torch.utils._pytree.tree_leaves(out)
                      if isinstance(t, torch.Tensor) and t.requires_grad]
            if not leaves:
                raise ProfileError(f"{ref.ref}: the model's output does not require grad (nothing to train)")
            sum(t.float().sum() for t in leaves).backward()  # type: ignore[union-attr]
        for h in hooks:
            h.remove()
    except (ProfileError, MemoryError):  # a MemoryError is the sandbox's limit: the child names it
        raise
    except Exception as exc:  # the user's model code
        raise ProfileError(f"{ref.ref}({batch}) failed on the meta device: {type(exc).__name__}: {exc}") from None
    return record, model


def _recorder(record: _Pass, tracker: Any, layer: Callable[[], str]) -> Any:
    """A dispatch mode that adds each op's FLOPs and bytes to ``record`` under ``layer()``, the innermost module open
    (forward figures too while ``tracker`` is not in backward)."""
    from torch.utils._python_dispatch import TorchDispatchMode  # lazy: torch is an optional extra (heavy import)

    class Recorder(TorchDispatchMode):  # type: ignore[no-untyped-call]
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            packet = func.overloadpacket
            if func.is_view or packet.__name__ in FREE_OPS:
                return out
            op_class, flops = _classify(packet, args, kwargs, out)
            read, written = _nbytes((args, kwargs)), _nbytes(out)
            name = layer()
            cell = record.work[(name, op_class)]
            cell[0] += flops
            cell[1] += read + written
            cell[2] += 1
            if not tracker.is_bw:
                f = record.fwd[name]
                f[0] += flops
                f[1] += flops if op_class == "tensor" else 0.0
                f[2] += read
                f[3] += written
            return out

    return Recorder()  # type: ignore[no-untyped-call]


def _shape_hook(record: _Pass, name: str) -> Callable[..., None]:
    def hook(module: Any, args: Any, out: Any) -> None:
        import torch  # lazy: torch is an optional extra (heavy import)

        if isinstance(out, torch.Tensor):
            record.shapes.setdefault(name, tuple(out.shape[1:]))

    return hook


def _kind(module: Any, tensor_flops: float) -> str:
    cls = type(module).__name__
    for prefix, kind in KIND_BY_MODULE.items():
        if cls.startswith(prefix):
            return kind
    return "matmul" if tensor_flops else "add"


def _depthwise(module: Any) -> bool:
    groups, channels = getattr(module, "groups", 1), getattr(module, "in_channels", 0)
    return type(module).__name__.startswith("Conv") and isinstance(groups, int) and 1 < groups == channels


def profile_factory(ref: FactoryRef, default_batch: int = 64) -> ModelProfile:
    """The per-example, per-layer profile of ``ref``'s model (forward + backward, fp32)."""
    lo, hi = BATCHES
    small, _ = _run_pass(ref, lo)
    big, model = _run_pass(ref, hi)
    span = hi - lo
    modules = dict(model.named_modules())

    def per_ex(a: float, b: float) -> int:
        return max(0, round((b - a) / span))

    layers = []
    for name in sorted(big.order, key=big.order.__getitem__):
        module = modules.get("" if name == "(model)" else name)
        own = list(module.named_parameters(recurse=False)) if module is not None else []
        buffers = list(module.named_buffers(recurse=False)) if module is not None else []
        variables = tuple(Variable(f"{name}/{n}", tuple(p.shape)) for n, p in own) + tuple(
            Variable(f"{name}/{n}", tuple(b.shape), trainable=False) for n, b in buffers if b.is_floating_point()
        )
        f_small, f_big = small.fwd.get(name, [0.0] * 4), big.fwd.get(name, [0.0] * 4)
        ops = tuple(
            OpWork(c, per_ex(small.work.get((name, c), [0.0] * 3)[0], big.work[(name, c)][0]),
                   per_ex(small.work.get((name, c), [0.0] * 3)[1], big.work[(name, c)][1]),
                   int(big.work[(name, c)][2]))
            for c in ("tensor", "vector", "memory") if (name, c) in big.work
        )
        tensor_fwd = per_ex(f_small[1], f_big[1])
        layers.append(Layer(
            name=name,
            kind=_kind(module, tensor_fwd) if module is not None else "add",
            output_shape=big.shapes.get(name, ()),
            macs=tensor_fwd // 2,
            flops=per_ex(f_small[0], f_big[0]),
            read_bytes=per_ex(f_small[2], f_big[2]),
            write_bytes=per_ex(f_small[3], f_big[3]),
            weight_bytes=sum(v.nbytes for v in variables if v.trainable),
            saved_bytes=per_ex(small.saved.get(name, 0.0), big.saved.get(name, 0.0)),
            variables=variables,
            train_ops=ops,
            depthwise=_depthwise(module),
        ))
    return ModelProfile(
        name=f"torch:{ref.ref}",
        description=f"PyTorch model {ref.ref} (profiled on the meta device, forward + backward)",
        example="one input of the factory's batch",
        input_shape=(),
        default_batch=default_batch,
        layers=tuple(layers),
    )
