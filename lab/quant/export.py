"""A pasted model into the PT2E flow: ``torch.export`` with what the lab adds so real-world model code exports,
and the x86 quantizer kept to the float tensors it can quantize.

Why these are the lab's to do (each met on a model as people write and paste it):

* **one source partition per call site** (:func:`export_for_quant`): a module called twice (the ResNet block
  reuses one ``nn.ReLU``) exports as one partition with two outputs, which the quantizer refuses ("Input partition
  has more than one output node"); the call index torch.export already records is appended to each node's module
  path, so each call is matched on its own.
* **the causal-mask check is skipped while exporting** (:data:`WHY_CAUSAL_MASK`): ``nn.TransformerEncoder`` asks
  whether a float mask is causal by comparing its values, a data-dependent branch export cannot trace
  (``GuardOnDataDependentSymNode: Eq(u0, 1)``: PyTorch's word_language_model ``TransformerModel``); the mask is then
  applied as given, which computes the same attention. Turning the fast path off does not help (the check runs
  before it), nor does strict export. A model torch.export still cannot trace raises :class:`ExportFailed`, and
  :mod:`lab.quant.int8` takes the legacy flow where it can (``flow_fallback``) or refuses in one line.
* **only float tensors are observed** (:func:`float_only_quantizer`): ``X86InductorQuantizer`` annotates
  ``aten.mul`` (and the other ops it quantizes) whatever their dtype, so integer arithmetic inside ``forward``
  (RoBERTa's position ids: an int mask, its cumsum, their product) got a histogram observer, which fails
  ("histogram_cpu" not implemented for 'Int'). Such ops are marked not-to-quantize before it annotates, and the
  report lists them (``integer_ops_not_observed``).

Used by :mod:`lab.quant.pt2e`; torchao is imported lazily here too.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import logging
import warnings
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn


@contextlib.contextmanager
def torchao_noise_filtered() -> Iterator[None]:
    """torchao logs "Failed to load ..._C_cutlass_90a / _C_mxfp8" at import on a CPU box (its CUDA extensions)
    and torch warns about an Enum it registers: harmless, silenced here and only here."""
    logs = [logging.getLogger(name) for name in ("torchao", "torch.utils._pytree")]
    levels = [log.level for log in logs]
    for log in logs:
        log.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r".*is an Enum subclass.*")
            warnings.filterwarnings("ignore", message=r"`torch\.jit\.script_method` is deprecated",
                                    category=DeprecationWarning)
            # torch.export of nn.LSTM: its cached _flat_weights list is reassigned while tracing (harmless)
            warnings.filterwarnings("ignore", message=r"The tensor attributes .*_flat_weights")
            yield
    finally:
        for log, level in zip(logs, levels, strict=True):
            log.setLevel(level)


# ---------------------------------------------------------------------------------------- export


def _unique_call_sites(gm: torch.fx.GraphModule) -> None:
    """Give every call of a reused module its own source partition: torch.export keys the second call of
    ``stages.0.0.relu`` as ``...relu@1`` but keeps the same module path, which merges both calls into one
    partition with two outputs; the quantizer raises on that. The path gets the ``@k`` suffix of its key."""
    for node in gm.graph.nodes:
        stack = node.meta.get("nn_module_stack")
        if stack:
            node.meta["nn_module_stack"] = {
                key: ((path + "@" + key.rpartition("@")[2]) if "@" in key else path, cls)
                for key, (path, cls) in stack.items()}


WHY_CAUSAL_MASK = ("nn.TransformerEncoder / Decoder ask whether a float attention mask is causal by comparing its "
                   "values (torch.nn.modules.transformer._detect_is_causal_mask), a data-dependent branch torch.export "
                   "cannot trace (GuardOnDataDependentSymNode: Eq(u0, 1)); while exporting, the check was skipped and "
                   "the mask is applied as given (is_causal=False: the same attention, without the causal-kernel hint)")


class ExportFailed(ValueError):
    """torch.export could not trace the model: the PT2E flow cannot quantize it (the legacy one may)."""


class InductorFailed(ExportFailed):
    """Inductor could not compile the converted int8 graph (a torchao fusion pass asserting on a pattern it did not
    expect: ``qlinear_post_op_fusion`` on a Linear -> ReLU -> residual add under dynamic int8): the PT2E flow
    cannot run it, so the legacy flow takes the model as after a failed export, and the record says why."""

    @classmethod
    def of(cls, exc: BaseException) -> InductorFailed:
        """From torch's ``BackendCompilerFailed``: its inner exception and the frame that raised it, in one line."""
        import traceback

        inner = getattr(exc, "inner_exception", None) or exc
        frames = traceback.extract_tb(inner.__traceback__)
        where = f" at {'/'.join(frames[-1].filename.split('/')[-3:])}:{frames[-1].lineno} in {frames[-1].name}" \
            if frames else ""
        text = (str(inner).strip().splitlines() or [""])[0]
        return cls(f"Inductor could not compile the int8 graph ({type(inner).__name__}{': ' + text if text else ''}"
                   f"{where})")


@contextlib.contextmanager
def _causal_mask_check_skipped(skipped: list[int]) -> Iterator[None]:
    """For the duration of one export, ``_detect_is_causal_mask`` returns the caller's hint (``is_causal``, None ->
    False) instead of comparing the mask's values (:data:`WHY_CAUSAL_MASK`); each skip appends to ``skipped``.
    A torch without the helper is left alone."""
    import torch.nn.modules.transformer as transformer

    detect = getattr(transformer, "_detect_is_causal_mask", None)
    if detect is None:  # pragma: no cover - another torch
        yield
        return

    def hint_only(mask: torch.Tensor | None, is_causal: bool | None = None, size: int | None = None) -> bool:
        if mask is None or is_causal is not None or not torch.compiler.is_compiling():
            return detect(mask, is_causal, size)
        skipped.append(1)
        return False

    transformer._detect_is_causal_mask = hint_only
    try:
        yield
    finally:
        transformer._detect_is_causal_mask = detect


def batch_dims(model: nn.Module, n_inputs: int) -> tuple:
    """``dynamic_shapes`` for a dynamic batch dimension on each of ``n_inputs`` positional inputs, shaped as
    ``model.forward``'s signature: inputs taken by ``*args`` (an adapter's ``forward(self, *inputs)``) are one
    tuple there, as torch.export matches the structure of the arguments."""
    dims = [{0: torch.export.Dim.AUTO} for _ in range(n_inputs)]
    try:
        params = list(inspect.signature(model.forward).parameters.values())
    except (TypeError, ValueError):
        return tuple(dims)
    for i, p in enumerate(params):
        if p.kind is inspect.Parameter.VAR_POSITIONAL:
            return (*dims[:i], tuple(dims[i:]))
    return tuple(dims)


def export_for_quant(model: nn.Module, example_inputs: tuple[torch.Tensor, ...],
                     notes: dict[str, Any] | None = None) -> torch.fx.GraphModule:
    """``torch.export`` of ``model`` in its current mode with a dynamic batch dimension (the graph must accept
    the calibration, training and evaluation batches alike), as the GraphModule PT2E works on. A Transformer's
    causal-mask check is skipped (:data:`WHY_CAUSAL_MASK`; said in ``notes["export"]``); a model export still
    cannot trace raises :class:`ExportFailed` naming the model and export's first line."""
    dims = batch_dims(model, len(example_inputs))
    skipped: list[int] = []
    try:
        with torchao_noise_filtered(), _causal_mask_check_skipped(skipped):
            gm = torch.export.export(model, tuple(example_inputs), dynamic_shapes=dims).module()
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise ExportFailed(f"torch.export cannot trace {type(model).__name__} ({type(exc).__name__}: "
                           f"{first[:200]})") from exc
    if skipped and notes is not None:
        notes["export"] = {"causal_mask_checks_skipped": len(skipped), "why": WHY_CAUSAL_MASK}
    _unique_call_sites(gm)
    return gm


# ---------------------------------------------------------------------------------------- annotate


WHY_INTEGER_OPS = ("X86InductorQuantizer annotates these ops whatever their dtype, and an observer on an integer "
                   "tensor fails (torch.histc has no integer kernel): they compute integers in forward (ids, masks, "
                   "positions), which int8 has nothing to do with, so they were marked not-to-quantize and only float "
                   "tensors are observed")


def _integer_valued(node: Any) -> bool:
    val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return isinstance(val, torch.Tensor) and not val.is_floating_point()


@functools.cache
def float_only_quantizer(base: type) -> type:
    """``base`` (``X86InductorQuantizer``) that first marks every op it could quantize which reads or makes an
    integer tensor as not-to-quantize (torchao's own "config None" mark), then annotates as ``base`` does; the ops
    marked are in ``integer_ops``."""
    x86 = importlib.import_module("torchao.quantization.pt2e.quantizer.x86_inductor_quantizer")
    kinds = frozenset(getattr(x86, "quantizable_ops", ()))

    class FloatOnlyX86InductorQuantizer(base):
        integer_ops: list[str]

        def annotate(self, model: torch.fx.GraphModule) -> torch.fx.GraphModule:
            marked = [n for n in model.graph.nodes if n.op == "call_function" and n.target in kinds
                      and (_integer_valued(n) or any(_integer_valued(a) for a in n.all_input_nodes))]
            x86._annotate_nodes_not_quantize(marked)
            self.integer_ops = [n.name for n in marked]
            return super().annotate(model)

    return FloatOnlyX86InductorQuantizer


__all__ = ["export_for_quant", "ExportFailed", "InductorFailed", "float_only_quantizer", "torchao_noise_filtered",
           "WHY_CAUSAL_MASK", "WHY_INTEGER_OPS"]
