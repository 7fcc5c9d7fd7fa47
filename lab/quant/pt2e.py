"""int8 on the maintained stack: torchao PT2E with the x86 Inductor quantizer, lowered by ``torch.compile``.

The flow (``quant.flow='pt2e'``, the default): ``torch.export`` the float model (batch dimension dynamic) ->
``prepare_pt2e`` (static, dynamic) or ``prepare_qat_pt2e`` (QAT, exported in train mode) with
``X86InductorQuantizer`` and its default config (int8 per-channel symmetric weights, uint8 per-tensor
activations, HistogramObserver for static) -> calibrate / fine-tune -> ``convert_pt2e`` -> ``torch.compile``
with Inductor *freezing* on, which folds the quantize / dequantize pairs around each conv and linear into one
oneDNN int8 kernel with packed weights. Without the compile the converted graph runs float ops between
explicit quantize / dequantize calls: a reference, slower than fp32. So the compiled model
(:class:`FrozenCompiled`) is what a run measures and stores, and the compile time is reported on its own.

Why the lab does a few things torchao does not do for it:

* **a pasted model exports, and only its float tensors are observed** (:mod:`lab.quant.export`): one source
  partition per call site of a reused module, a Transformer's data-dependent causal-mask check skipped while
  exporting, ops on integer tensors never annotated; a model torch.export cannot trace raises
  :class:`~lab.quant.export.ExportFailed`, and :mod:`lab.quant.int8` falls back to the legacy flow or refuses.
* **static shapes, one graph per batch size** (:class:`FrozenCompiled`): on torch 2.13 the Inductor int8 conv
  lowering fails with symbolic shapes, so each batch size met compiles its own graph; other batch sizes run
  through the largest compiled one in padded chunks instead of triggering a compile each.
* **freezing set in a scoped way**: ``torch.compile(options={"freezing": True})`` does not reach the int8
  weight folding on this torch (Dynamo reads the flag while tracing, before any backend); ``torch._inductor.
  config.patch(freezing=True)`` around each compiling call does, and leaves the global config alone. A call is a
  compiling one also when Dynamo's cache was cleared since (a ``torch._dynamo.reset()``, another PT2E build):
  :meth:`FrozenCompiled._run` checks the cache and takes the patch then too.
* **RNNs**: torch.export keeps ``nn.LSTM`` as one ``aten.lstm`` node that the quantizer does not annotate and
  Inductor has no int8 kernel for, so dynamic int8 of a model holding an RNN falls back to the legacy
  ``quantize_dynamic`` (whose int8 LSTM exists) and records why (``info["flow_fallback"]``).

torchao is imported lazily: ``lab`` works without it, and asking for this flow without it is one clear line.
Taught in ``notebooks/04_quantization``; measured in ``benchmarks/quantization.py``.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import importlib
import time
import warnings
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

from lab.config import QuantConfig
from lab.quant.export import (
    WHY_INTEGER_OPS,
    InductorFailed,
    export_for_quant,
    float_only_quantizer,
    torchao_noise_filtered,
)
from lab.quant.graph import check_graph_quantized, graph_swap_report
from lab.quant.numerics import reduce_range_choice
from lab.quant.storage import compact_int8_graph

TORCHAO_MISSING = ("quant.flow='pt2e' needs torchao (pinned in pyproject.toml: pip install 'torchao==0.18.0'); "
                   "install it, or use --quant-flow legacy")
API_PT2E = {
    "static": "torchao PT2E: torch.export -> prepare_pt2e(X86InductorQuantizer) -> calibrate -> convert_pt2e "
              "-> torch.compile (Inductor, freezing)",
    "dynamic": "torchao PT2E: torch.export -> prepare_pt2e(X86InductorQuantizer, is_dynamic=True) -> convert_pt2e "
               "-> torch.compile (Inductor, freezing)",
    "qat": "torchao PT2E: torch.export (train) -> prepare_qat_pt2e(X86InductorQuantizer, is_qat=True) -> fine-tune "
           "-> convert_pt2e -> torch.compile (Inductor, freezing)",
}
API_REASON_PT2E = ("torch.ao.quantization is deprecated in favour of torchao; PT2E + X86InductorQuantizer lowered by "
                   "Inductor (freezing) runs fused oneDNN int8 kernels, which is where int8 pays on this CPU")
WHY_RNN_FALLBACK = ("PT2E cannot quantize nn.LSTM / nn.GRU: torch.export keeps each as one aten.lstm / aten.gru "
                    "node, X86InductorQuantizer annotates no RNN op and Inductor has no int8 RNN kernel; the legacy "
                    "torch.ao quantize_dynamic has an int8 LSTM, so this model took the legacy flow")
_TORCHAO_MODULES = ("torchao.quantization.pt2e.quantize_pt2e",
                    "torchao.quantization.pt2e.quantizer.x86_inductor_quantizer", "torchao.quantization.pt2e")


def torchao_pt2e() -> SimpleNamespace:
    """The torchao PT2E entry points, or ``ValueError(TORCHAO_MISSING)`` when torchao cannot be imported."""
    try:
        with torchao_noise_filtered():
            mods = [importlib.import_module(name) for name in _TORCHAO_MODULES]
    except ImportError as exc:
        raise ValueError(TORCHAO_MISSING) from exc
    q, x86, pt2e = mods
    return SimpleNamespace(prepare_pt2e=q.prepare_pt2e, prepare_qat_pt2e=q.prepare_qat_pt2e,
                           convert_pt2e=q.convert_pt2e, X86InductorQuantizer=x86.X86InductorQuantizer,
                           default_config=x86.get_default_x86_inductor_quantization_config,
                           to_eval=pt2e.move_exported_model_to_eval, to_train=pt2e.move_exported_model_to_train,
                           allow_train_eval=pt2e.allow_exported_model_train_eval)


def check_available() -> None:
    """Before any work: the flow's library is importable (one line otherwise)."""
    torchao_pt2e()


def make_quantizer(method: str, reduce_range: bool = False) -> Any:
    """``X86InductorQuantizer`` with its default config for ``method`` (per-channel int8 weights). With
    ``reduce_range`` (:func:`lab.quant.numerics.reduce_range_choice`: CPUs without VNNI) the activations into
    Linear layers and attention get 7 bits and convolutions keep 8: measured with oneDNN capped at AVX2, 8-bit
    activations cost the tiny MLP / Transformer 0.085 / 0.129 relative output error (0.017 / 0.016 at 7 bits),
    while the ResNet's convolutions read 0.0065 at 8 bits and 0.013 at 7 (0.0072 with only its head at 7).
    Dynamic int8 is set for ``nn.Linear`` only: the global dynamic config also annotates convolutions, for which
    Inductor has no dynamic int8 kernel (and whose per-batch activation scales were seen to cost 40 % output
    error here). Ops on integer tensors are never annotated (:data:`WHY_INTEGER_OPS`)."""
    ao = torchao_pt2e()
    config = ao.default_config(is_qat=method == "qat", is_dynamic=method == "dynamic")
    narrow = ao.default_config(is_qat=method == "qat", is_dynamic=method == "dynamic", reduce_range=True)
    quantizer = float_only_quantizer(ao.X86InductorQuantizer)()
    if method == "dynamic":
        return quantizer.set_module_type_qconfig(nn.Linear, narrow if reduce_range else config)
    quantizer.set_global(config)
    if reduce_range:
        for kind in (nn.Linear, nn.MultiheadAttention):
            quantizer.set_module_type_qconfig(kind, narrow)
    return quantizer


#: A BatchNorm scale this small is nudged away from 0 before QAT (see :func:`nudge_zero_bn_scales`).
BN_SCALE_FLOOR = 1e-4


def nudge_zero_bn_scales(model: nn.Module) -> list[str]:
    """torchao's QAT conv-bn fusion computes ``conv(x, w * s) / s`` with ``s = gamma / std``, so a BatchNorm
    whose gamma is exactly 0 (zero-init residual blocks, ResNet's last BN per block before training) turns the
    whole forward into NaN. Such entries get ``BN_SCALE_FLOOR`` (the block's output moves by ~1e-4 x its
    input); returns the BatchNorms changed."""
    names = []
    with torch.no_grad():
        for name, m in model.named_modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.affine and bool((m.weight == 0).any()):
                m.weight[m.weight == 0] = BN_SCALE_FLOOR
                names.append(name)
    return names


# ------------------------------------------------------------------------------------------- compile


@functools.cache
def _cache_entries() -> Callable[[Any], list] | None:
    """Dynamo's private, read-only view of the graphs it still holds for a code object, or None on a torch
    without it (every call of a compiled size then takes the patch: correct, slower). Imported on first use,
    not with ``lab``: ``torch._dynamo`` doubles the start-up of every process that imports the lab (each
    spawned rank, each CLI call), and a model is compiled here before this is ever asked."""
    try:
        from torch._dynamo.eval_frame import _debug_get_cache_entry_list
    except ImportError:  # pragma: no cover - another torch
        return None
    return _debug_get_cache_entry_list


@contextlib.contextmanager
def _freezing() -> Iterator[None]:
    """Inductor freezing for the compiles inside, global config untouched; Inductor's int8 lowering builds
    tensors from Python scalars ("To copy construct from a tensor ..."): that warning is filtered here."""
    import torch._inductor.config as inductor_config

    with inductor_config.patch(freezing=True), warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=UserWarning, module=r"torch\._inductor")
        yield


class FrozenCompiled(nn.Module):
    """A model as Inductor runs it for inference: ``torch.compile`` with freezing, under ``no_grad``.

    Two static graphs at most: batch 1 and the first batch size > 1 met (the *bucket*; ``compile_s`` records each
    compile's seconds: the first call at that size). Any other batch size runs through the bucket's graph in
    padded chunks, so an evaluation split's odd tail does not cost another compile. Under a
    dispatch mode (the FLOP counter) the eager graph runs instead: a compiled graph is opaque to it.
    ``train()`` never recurses: the wrapped graph is inference-only (a converted PT2E graph refuses it)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.graph = model
        # not a registered submodule: its _orig_mod is ``graph`` again (state_dict and .train() would see it twice)
        self.__dict__["_compiled"] = torch.compile(model, dynamic=False)
        # the code object dynamo caches the graph under (an fx GraphModule's class is its own, so its forward is
        # this graph's alone; a float model's forward is shared with its class's other instances)
        self.__dict__["_code"] = getattr(getattr(type(model), "forward", None), "__code__", None)
        self.compile_s: dict[int, float] = {}

    def train(self, mode: bool = True) -> FrozenCompiled:
        self.training = mode
        return self

    @property
    def batch_sizes(self) -> list[int]:
        return sorted(self.compile_s)

    def _call(self, inputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
        b = int(inputs[0].shape[0])
        if b in self.compile_s:
            return self._run(inputs)
        bucket = max((n for n in self.compile_s if n > 1), default=None)
        if bucket is not None and b != 1:
            return self._chunked(inputs, bucket)
        t0 = time.perf_counter()
        with _freezing():
            out = self._compiled(*inputs)
        self.compile_s[b] = time.perf_counter() - t0
        return out

    def _run(self, inputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """A call at a batch size compiled before. Dynamo's cache of the graph can be gone since (a
        ``torch._dynamo.reset()``, or another PT2E build: both clear it), and the call then recompiles: under
        the freezing patch, or Inductor leaves quantize -> int8 GEMM -> dequantize unfused and the int8 graph
        runs at fp32 speed (PT2E static 0.99x on ctr xl in a map, 6.7x before). The patch costs ~12 us per
        call, a batch-1 int8 call's worth, so it is taken only when the cache is empty (a ~0.5 us check)."""
        if self._graph_cached():
            return self._compiled(*inputs)
        with _freezing():
            return self._compiled(*inputs)

    def _graph_cached(self) -> bool:
        code = self.__dict__.get("_code")
        entries = _cache_entries() if code is not None else None
        return entries is not None and bool(entries(code))

    def _chunked(self, inputs: tuple[torch.Tensor, ...], n: int) -> torch.Tensor:
        total, outs = int(inputs[0].shape[0]), []
        for i in range(0, total, n):
            part = tuple(t[i:i + n] for t in inputs)
            k = int(part[0].shape[0])
            if k < n:  # pad by repeating the last row: rows are independent in eval mode
                part = tuple(torch.cat([t, t[-1:].expand(n - k, *t.shape[1:])]) for t in part)
            outs.append(self._run(part)[:k])
        return torch.cat(outs)

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            if torch._C._len_torch_dispatch_stack():
                return self.graph(*inputs)
            try:
                return self._call(inputs)
            except torch._dynamo.exc.BackendCompilerFailed as exc:  # the flow's failure, one line (InductorFailed)
                raise InductorFailed.of(exc) from exc


def compile_frozen(model: nn.Module) -> FrozenCompiled:
    """``model`` (a converted PT2E graph, or a float model for the fair baseline) compiled the same way."""
    if isinstance(model, torch.fx.GraphModule):
        torchao_pt2e().allow_train_eval(model)  # .eval()/.train() of a lab measurement must not raise
    model.eval()  # not chained: torchao's patched eval() of an exported graph returns None
    return FrozenCompiled(model)


# ------------------------------------------------------------------------------------------ quantize


@contextlib.contextmanager
def _fold_only_present_convs(gm: torch.fx.GraphModule) -> Iterator[None]:
    """``convert_pt2e`` of a QAT graph folds BatchNorm by exporting 12 small match / replacement patterns for
    each of conv1d, conv2d, conv_transpose1d and conv_transpose2d (48 ``torch.export`` calls, ~100 s on this
    2-core machine) whether or not the graph holds that conv. For the duration of one convert, torchao's
    helper is skipped for conv kinds absent from the graph: same result, a quarter of the time. Without the
    private helper (another torchao version) nothing is patched."""
    import torch.nn.functional as F

    try:
        qat_utils = importlib.import_module("torchao.quantization.pt2e.qat_utils")
        helper = qat_utils._fold_conv_bn_qat_helper
    except (ImportError, AttributeError):
        yield
        return
    aten = torch.ops.aten
    present = {n.target for n in gm.graph.nodes if n.op == "call_function"}
    kinds = {F.conv1d: aten.conv1d.default, F.conv2d: aten.conv2d.default,
             F.conv_transpose1d: aten.conv_transpose1d.default, F.conv_transpose2d: aten.conv_transpose2d.input}

    def only_present(m: torch.fx.GraphModule, conv_fn: Any, *args: Any, **kwargs: Any) -> torch.fx.GraphModule:
        if conv_fn in kinds and kinds[conv_fn] not in present:
            return m
        return helper(m, conv_fn, *args, **kwargs)

    qat_utils._fold_conv_bn_qat_helper = only_present
    try:
        yield
    finally:
        qat_utils._fold_conv_bn_qat_helper = helper


def has_rnn(model: nn.Module) -> bool:
    return any(isinstance(m, nn.RNNBase) for m in model.modules())


def check_pt2e_config(qc: QuantConfig) -> None:
    """What the x86 Inductor quantizer's default config cannot express, refused with the way out."""
    if not qc.per_channel:
        raise ValueError("quant.per_channel=False is invalid with quant.flow='pt2e': X86InductorQuantizer's default "
                         "config quantizes weights per channel; use --quant-flow legacy for per-tensor weights")
    if qc.method == "static" and qc.observer != QuantConfig().observer:
        raise ValueError(f"quant.observer={qc.observer!r} is invalid with quant.flow='pt2e': X86InductorQuantizer's "
                         "default config calibrates with a histogram observer; use --quant-flow legacy to compare "
                         "observers")


def quantize_pt2e_with_report(model: nn.Module, qc: QuantConfig, batches: Callable[[int], list[tuple]],
                              *, finetune: Callable[[nn.Module], Any] | None = None,
                              example_inputs: tuple | None = None) -> tuple[nn.Module, dict[str, Any]]:
    """The PT2E int8 model of ``model`` (untouched) compiled for inference, and what was done.

    ``batches(n)`` gives the first ``n`` calibration input tuples; ``example_inputs`` traces the model
    (default: the first calibration batch). Raises :class:`~lab.quant.swap.QuantizationNoOpError` when the
    converted graph holds no int8 op."""
    check_pt2e_config(qc)
    ao = torchao_pt2e()
    float_model = copy.deepcopy(model).cpu().eval()
    info: dict[str, Any] = {"method": qc.method, "flow": "pt2e", "engine": "x86 (Inductor + oneDNN)",
                            "api": API_PT2E[qc.method], "api_reason": API_REASON_PT2E, "per_channel": True,
                            "observer": {"static": "histogram (X86InductorQuantizer default)",
                                         "qat": "moving-average min/max fake-quant (X86InductorQuantizer default)",
                                         "dynamic": "none (dynamic: per-batch activation scales)"}[qc.method],
                            "inductor": {"freezing": True, "dynamic_shapes": False}}
    if qc.method == "qat" and finetune is None:
        raise ValueError("quant.method='qat' needs finetune: a callable that trains the fake-quant model")
    calib = batches(qc.calibration_batches) if qc.method == "static" else []
    if example_inputs is None:
        example_inputs = calib[0] if calib else batches(1)[0]
    info["reduce_range"] = reduce_range_choice(qc.reduce_range, "pt2e")
    quantizer = make_quantizer(qc.method, info["reduce_range"]["used"])
    t0 = time.perf_counter()
    if qc.method == "qat":
        train_copy = copy.deepcopy(model).cpu().train()
        nudged = nudge_zero_bn_scales(train_copy)
        if nudged:
            info["qat_bn_scales_nudged"] = {"modules": nudged, "to": BN_SCALE_FLOOR,
                                            "why": "torchao's QAT conv-bn fusion divides by the BN scale"}
        gm = export_for_quant(train_copy, example_inputs, info)
        prepared = ao.prepare_qat_pt2e(gm, quantizer)
        ao.allow_train_eval(prepared)  # the lab's loop calls .train(); torchao swaps BN / dropout to train ops
        finetune(prepared)
        prepared = ao.to_eval(prepared.cpu())
    else:
        prepared = ao.prepare_pt2e(export_for_quant(float_model, example_inputs, info), quantizer)
        with torch.no_grad():
            # dynamic too needs one forward: its weight observers run there (else the scales stay at 1.0)
            for inputs in calib or [example_inputs]:
                prepared(*inputs)
        info["calibration_batches_used"] = len(calib)
    if getattr(quantizer, "integer_ops", None):
        info["integer_ops_not_observed"] = {"ops": quantizer.integer_ops, "why": WHY_INTEGER_OPS}
    with torchao_noise_filtered(), _fold_only_present_convs(prepared):
        converted = ao.convert_pt2e(prepared)
    info["quantize_s"] = time.perf_counter() - t0
    info["swap"] = graph_swap_report(converted, float_model, qc.method)
    check_graph_quantized(info["swap"], qc.method)
    info["stored"] = compact_int8_graph(converted)
    frozen = compile_frozen(converted)
    # Compiled now at batch 1 (the size every measurement calls first, so no extra compile and the bucket stays
    # the first larger batch met): a graph Inductor cannot compile is the flow's failure (InductorFailed), and the
    # legacy flow takes the model (lab.quant.int8); a larger batch that fails later is retried there by the run
    # (lab.quant._quantize_trained).
    frozen(*tuple(t[:1] if isinstance(t, torch.Tensor) and t.dim() else t for t in example_inputs))
    return frozen, info


def converted_graph(model: nn.Module) -> torch.fx.GraphModule | None:
    """The converted PT2E graph inside a compiled int8 model (None for other models)."""
    graph = getattr(model, "graph", None)
    return graph if isinstance(model, FrozenCompiled) and isinstance(graph, torch.fx.GraphModule) else None


__all__ = [
    "API_PT2E", "API_REASON_PT2E", "check_available", "check_pt2e_config", "compile_frozen", "converted_graph",
    "FrozenCompiled", "has_rnn", "make_quantizer", "nudge_zero_bn_scales", "quantize_pt2e_with_report",
    "TORCHAO_MISSING", "torchao_pt2e", "WHY_RNN_FALLBACK",
]
