"""Int8 quantization: dynamic, static (calibrated) and quantization-aware training, with a swap guard.

Two flows behind one interface, :func:`quantize`. ``quant.flow='pt2e'`` (default) is the maintained stack:
torchao PT2E with ``X86InductorQuantizer``, compiled by Inductor (:mod:`lab.quant.pt2e`). ``quant.flow='legacy'``
keeps the deprecated ``torch.ao.quantization`` path for comparison: ``quantize_dynamic`` for ``dynamic`` and FX
graph mode for ``static`` and ``qat`` (our ResNet adds residuals with a plain ``+`` and uses in-place ReLU, which
eager static quantization cannot handle without rewriting the model around ``FloatFunctional``); its
deprecation warnings are filtered in one place, :func:`ao_warnings_filtered`. The flow, the API and the reason
land in ``result.details["quant"]``. int8 here is CPU-only; a torchao GPU weight-only path is benchmarked on a GPU.

The swap guard: quantization APIs skip modules they do not support *silently* (dynamic int8 of
``nn.LSTM`` has been seen to change nothing on some torch versions), so after every call we list which
of the modules asked for were replaced by quantized ones and which stayed float, and raise
:class:`QuantizationNoOpError` if none were. A no-op must never be reported as int8.

Taught in ``notebooks/04_quantization``; measured in ``benchmarks/quantization.py``; the run's technique is
:mod:`lab.quant`.
"""

from __future__ import annotations

import contextlib
import copy
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch import nn

from lab.config import QuantConfig, RunConfig
from lab.context import resolve_device
from lab.quant.export import ExportFailed, export_for_quant
from lab.quant.numerics import reduce_range_choice
from lab.quant.swap import (
    API,
    MIN_EMBEDDING_DIM,
    WHY_CONV1D,
    WHY_FASTPATH,
    WHY_FLOAT_ANCHOR,
    check_swapped,
    is_conv1d,
    keep_a_float_parameter,
    keep_int8_layers_unfused,
    linearize_conv1d,
    narrow_embeddings,
    restore_float_leftovers,
    swap_report,
)

API_REASON = ("legacy flow (quant.flow='legacy'): torch.ao eager/FX int8 kernels, kept beside PT2E for comparison; "
              "FX graph mode handles the ResNet's plain `+` residuals and in-place ReLU without rewriting the model")


# ------------------------------------------------------------------------------------------ warnings


@contextlib.contextmanager
def ao_warnings_filtered() -> Iterator[None]:
    """The one place torch.ao's warnings are silenced, and only around our own calls.

    torch 2.13 deprecates ``torch.ao.quantization`` (in favour of torchao) and repeats the warning on
    every call; we use it on purpose (see the module docstring), so that exact message is filtered here,
    never globally. The observer's "use quant_min and quant_max" notice is about ``reduce_range``, which
    we set on purpose too (7-bit activations avoid int16 overflow in fbgemm/x86 kernels on CPUs without
    VNNI)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"torch\.ao\.quantization is deprecated",
                                category=DeprecationWarning)
        warnings.filterwarnings("ignore", message=r"Please use quant_min and quant_max", category=UserWarning)
        # Same deprecation, raised from C++ as a UserWarning when int8 weights are created.
        warnings.filterwarnings("ignore", message=r"torch\.quantize_per_tensor, torch\.quantize_per_channel",
                                category=UserWarning)
        yield


# ------------------------------------------------------------------------------- affine, by the book


def affine_qparams(x: torch.Tensor, *, qmin: int = 0, qmax: int = 255) -> tuple[float, int]:
    """Scale and zero point mapping ``[min(x, 0), max(x, 0)]`` onto ``[qmin, qmax]`` (asymmetric, per
    tensor). The range always contains 0 so that 0.0 (padding, ReLU output) is exactly representable."""
    lo, hi = min(float(x.min()), 0.0), max(float(x.max()), 0.0)
    scale = (hi - lo) / (qmax - qmin) if hi > lo else 1.0
    zero_point = int(min(max(qmin - round(lo / scale), qmin), qmax))
    return scale, zero_point


def affine_quantize(x: torch.Tensor, scale: float, zero_point: int, *, qmin: int = 0,
                    qmax: int = 255) -> torch.Tensor:
    """``clamp(round(x / scale) + zero_point)`` as int32 codes (round half to even, like torch)."""
    return torch.clamp(torch.round(x / scale) + zero_point, qmin, qmax).to(torch.int32)


def affine_dequantize(q: torch.Tensor, scale: float, zero_point: int) -> torch.Tensor:
    """``(q - zero_point) * scale``: the round trip error is at most ``scale / 2`` inside the range."""
    return (q.to(torch.float32) - zero_point) * scale


# --------------------------------------------------------------------------------------- config checks


def check_supported(cfg: RunConfig) -> None:
    """Refuse, before any training, what int8 here cannot do: CUDA runs and reduced-precision autocast."""
    qc = cfg.quant
    if qc.enabled and resolve_device(cfg.device).type != "cpu":
        raise ValueError(f"quant.method={qc.method!r} is invalid with device={cfg.device!r}: torch.ao int8 kernels "
                         "run on CPU only; use device='cpu' (there is no GPU int8 path yet)")
    if qc.enabled and cfg.precision.dtype != "fp32":
        raise ValueError(f"quant.method={qc.method!r} is invalid with precision.dtype={cfg.precision.dtype!r}: "
                         "int8 calibrates and converts an fp32 model (fp16/bf16 autocast would feed the int8 "
                         "kernels reduced-precision activations); use precision.dtype='fp32'")


def resolve_engine(backend: str) -> str:
    """``auto`` -> ``x86`` where torch supports it (fbgemm + onednn heuristics), else ``qnnpack`` (ARM)."""
    engines = torch.backends.quantized.supported_engines
    engine = ("x86" if "x86" in engines else "qnnpack") if backend == "auto" else backend
    if engine not in engines:
        raise ValueError(f"quant.backend={backend!r} is invalid: this torch supports {', '.join(engines)}")
    return engine


# ------------------------------------------------------------------------------------------- qconfigs


def make_qconfig(qc: QuantConfig, engine: str) -> Any:
    """The QConfig for ``qc``: activations with the chosen observer (or moving-average fake-quant for QAT),
    weights int8 symmetric, per channel or per tensor. ``reduce_range`` follows torch's own defaults unless
    ``qc.reduce_range`` forces it (:func:`lab.quant.numerics.reduce_range_choice`)."""
    from torch.ao import quantization as tq

    reduce_range = reduce_range_choice(qc.reduce_range, "legacy", engine)["used"]
    act_max = 127 if reduce_range else 255
    if qc.per_channel:
        w_obs, w_scheme = tq.MovingAveragePerChannelMinMaxObserver, torch.per_channel_symmetric
        w_obs_ptq = tq.PerChannelMinMaxObserver
    else:
        w_obs, w_scheme = tq.MovingAverageMinMaxObserver, torch.per_tensor_symmetric
        w_obs_ptq = tq.MinMaxObserver
    if qc.method == "qat":
        act = tq.FakeQuantize.with_args(observer=tq.MovingAverageMinMaxObserver, quant_min=0, quant_max=act_max,
                                        dtype=torch.quint8, qscheme=torch.per_tensor_affine)
        weight = tq.FakeQuantize.with_args(observer=w_obs, quant_min=-128, quant_max=127, dtype=torch.qint8,
                                           qscheme=w_scheme)
        return tq.QConfig(activation=act, weight=weight)
    observers = {"histogram": tq.HistogramObserver, "minmax": tq.MinMaxObserver,
                 "moving_average": tq.MovingAverageMinMaxObserver}
    act = observers[qc.observer].with_args(dtype=torch.quint8, quant_min=0, quant_max=act_max)
    weight = w_obs_ptq.with_args(dtype=torch.qint8, qscheme=w_scheme)
    return tq.QConfig(activation=act, weight=weight)


def _fixed_qparams_ops(mapping: Any, qconfig: Any, qat: bool) -> None:
    """Sigmoid / tanh / softmax / hardsigmoid have a fixed output range: torch.ao quantizes them only with
    a fixed-qparams observer (a squeeze-excitation gate's sigmoid would otherwise run float between a
    dequantize and a quantize), as its own default mapping does."""
    from torch.ao import quantization as tq
    from torch.ao.quantization.qconfig_mapping import _FIXED_QPARAMS_OP_TO_OBSERVER

    for op, observer in _FIXED_QPARAMS_OP_TO_OBSERVER.items():
        act = tq.FixedQParamsFakeQuantize.with_args(observer=observer) if qat else observer
        mapping.set_object_type(op, tq.QConfig(activation=act, weight=qconfig.weight))


def _qconfig_mapping(qc: QuantConfig, engine: str, example_inputs: tuple, skip: list[str]) -> tuple[Any, str]:
    """Global mapping (ops between layers run int8 too) unless the model takes integer inputs (ids for
    embeddings): then only layer types are quantized, because the global mapping would put an observer
    on the id tensor (``histc`` has no integer kernel) and quantize integer index arithmetic."""
    from torch.ao import quantization as tq

    qconfig = make_qconfig(qc, engine)
    weight_only = tq.float_qparams_weight_only_qconfig
    if all(torch.is_floating_point(t) for t in example_inputs):
        mapping = tq.QConfigMapping().set_global(qconfig)
        kind = "global"
        _fixed_qparams_ops(mapping, qconfig, qc.method == "qat")
    else:
        mapping = tq.QConfigMapping()
        for layer in (nn.Linear, nn.Conv2d, nn.ReLU, nn.BatchNorm1d, nn.BatchNorm2d):  # fused patterns agree
            mapping.set_object_type(layer, qconfig)
        kind = "layer types only (integer inputs)"
    mapping.set_object_type(nn.EmbeddingBag, weight_only).set_object_type(nn.Embedding, weight_only)
    for name in skip:
        mapping.set_module_name(name, None)
    return mapping, kind


# ------------------------------------------------------------------------------------------- quantize


def _as_quant_config(cfg: QuantConfig | RunConfig) -> QuantConfig:
    qc = cfg.quant if isinstance(cfg, RunConfig) else cfg
    if not isinstance(qc, QuantConfig):
        raise ValueError(f"cfg={cfg!r} is invalid: must be a QuantConfig or a RunConfig")
    if not qc.enabled:
        raise ValueError("quant.method='none' is invalid for quantize(): allowed: dynamic, static, qat")
    return qc


def calibration_batches(loader: Iterable | None, n_batches: int) -> list[tuple[torch.Tensor, ...]]:
    """The first ``n_batches`` input tuples (``batch[:-1]``, on CPU) of ``loader``; a clear error when
    there are none, because an uncalibrated observer would silently give garbage scales."""
    if loader is None:
        raise ValueError("quant.method='static' needs calibration data: pass calibration_loader (batches whose "
                         "last element is the target), like TFLite's representative_dataset")
    out = []
    for batch in loader:
        if len(out) >= n_batches:
            break
        out.append(tuple(t.cpu() for t in batch[:-1]))
    if not out:
        raise ValueError("calibration_loader yielded no batches: static quantization needs at least one batch "
                         "to set activation ranges")
    return out


WHY_CONTIGUOUS = ("torch.ops.quantized.embedding_byte needs contiguous indices, and models pass expanded ones "
                  "(Hugging Face BERT's token_type_ids buffer is .expand()ed to the batch: 'Expect weight, indices, "
                  "and offsets to be contiguous'); a forward pre-hook makes the int8 Embedding's indices contiguous")


def _contiguous_indices(module: nn.Module, args: tuple) -> tuple:
    return (args[0].contiguous(), *args[1:]) if args and isinstance(args[0], torch.Tensor) else args


def contiguous_embedding_indices(model: nn.Module) -> list[str]:
    """Give every int8 ``Embedding`` / ``EmbeddingBag`` of ``model`` a pre-hook that makes its indices (and
    offsets) contiguous (see :data:`WHY_CONTIGUOUS`); returns the layers hooked."""
    from torch.ao.nn import quantized as nnq

    names = []
    for n, m in model.named_modules():
        if isinstance(m, nnq.Embedding | nnq.EmbeddingBag):
            if _contiguous_indices not in m._forward_pre_hooks.values():
                m.register_forward_pre_hook(_contiguous_indices)
            names.append(n)
    return names


def fx_trace_failure(model: nn.Module) -> str | None:
    """Why FX symbolic tracing (the legacy static / QAT flow's first step) fails on ``model``, in one line; None
    when it traces."""
    from torch.ao.quantization.fx.tracer import QuantizationTracer

    try:
        with ao_warnings_filtered():
            QuantizationTracer([], []).trace(copy.deepcopy(model).cpu().eval())
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return f"{type(exc).__name__}: {first[:200]}"
    return None


def check_fx_traceable(model: nn.Module, method: str) -> None:
    """Before training: the legacy static / QAT flow builds its int8 model by FX symbolic tracing, which many
    library models (Hugging Face ones: ``len()`` of a proxy, data-dependent masks) cannot pass; refuse with the
    tracer's reason and the flow that can (torch.export)."""
    why = fx_trace_failure(model)
    if why is not None:
        raise ValueError(f"quant.method={method!r} with quant.flow='legacy' cannot trace {type(model).__name__}: FX "
                         f"symbolic tracing fails ({why}); use quant.flow='pt2e' (torch.export traces it)")


def check_some_flow_traces(model: nn.Module, method: str, example_inputs: tuple) -> None:
    """Before training, for PT2E static / QAT: where FX symbolic tracing fails (the legacy flow's way), export
    must pass, or the run would be refused only after training (:func:`_export_fallback_reason`'s ``ValueError``,
    raised here instead). A model FX traces needs no export here: the legacy flow takes it if export fails."""
    if fx_trace_failure(model) is None:
        return
    try:
        export_for_quant(copy.deepcopy(model).cpu().eval(), tuple(t.cpu() for t in example_inputs))
    except ExportFailed as exc:
        _export_fallback_reason(model, method, str(exc))


def quantize(model: nn.Module, cfg: QuantConfig | RunConfig, calibration_loader: Iterable | None = None, *,
             finetune: Callable[[nn.Module], Any] | None = None, example_inputs: tuple | None = None
             ) -> nn.Module:
    """An int8 copy of ``model`` (CPU, eval mode); ``model`` itself is left untouched.

    ``dynamic``: weights int8 ahead of time, activations quantized on the fly (no calibration).
    ``static``: activation ranges calibrated on ``cfg.calibration_batches`` batches of ``calibration_loader``.
    ``qat``: fake-quant inserted, ``finetune(prepared_model)`` trains it (the lab passes ``ctx.fit``), then
    converted; ``example_inputs`` (or the loader's first batch) traces the model.
    Raises :class:`QuantizationNoOpError` when nothing asked for was quantized.
    """
    return quantize_with_report(model, cfg, calibration_loader, finetune=finetune,
                                example_inputs=example_inputs)[0]


def quantize_with_report(model: nn.Module, cfg: QuantConfig | RunConfig, calibration_loader: Iterable | None = None,
                         *, finetune: Callable[[nn.Module], Any] | None = None, example_inputs: tuple | None = None
                         ) -> tuple[nn.Module, dict[str, Any]]:
    """:func:`quantize` plus what was done: flow, engine, API and reason, qconfig mapping, swap report.

    ``quant.flow='pt2e'`` (the default) goes through :mod:`lab.quant.pt2e` (torchao, compiled); a dynamic
    quantization of a model holding an RNN falls back to this legacy path and says why."""
    qc = _as_quant_config(cfg)
    model, linearized = _linearized(model)
    q, info = _dispatch(model, qc, calibration_loader, finetune=finetune, example_inputs=example_inputs)
    if linearized:
        info["linearized"] = {"layers": linearized, "why": WHY_CONV1D}
    return q, info


def _linearized(model: nn.Module) -> tuple[nn.Module, list[str]]:
    """``model`` itself, or a copy whose HF ``Conv1D`` layers are equivalent ``nn.Linear`` ones (and their names)."""
    if not any(is_conv1d(m) for m in model.modules()):
        return model, []
    copy_ = copy.deepcopy(model)
    return copy_, linearize_conv1d(copy_)


def _dispatch(model: nn.Module, qc: QuantConfig, calibration_loader: Iterable | None, *,
              finetune: Callable[[nn.Module], Any] | None, example_inputs: tuple | None
              ) -> tuple[nn.Module, dict[str, Any]]:
    if qc.flow == "auto":
        raise ValueError("quant.flow='auto' picks a flow by timing both on the run's batch: call "
                         "lab.quant.flow_auto.probe_flows (a lab run does), or name pt2e or legacy here")
    if qc.flow == "pt2e":
        from lab.quant import pt2e

        if qc.method == "dynamic" and pt2e.has_rnn(model):
            why = pt2e.WHY_RNN_FALLBACK
        else:
            try:
                return pt2e.quantize_pt2e_with_report(model, qc, lambda n: calibration_batches(calibration_loader, n),
                                                      finetune=finetune, example_inputs=example_inputs)
            except ExportFailed as exc:
                why = _export_fallback_reason(model, qc.method, str(exc))
        q, info = _legacy_with_report(model, qc, calibration_loader, finetune=finetune, example_inputs=example_inputs)
        info.update(flow_asked="pt2e", flow_fallback=why)
        return q, info
    return _legacy_with_report(model, qc, calibration_loader, finetune=finetune, example_inputs=example_inputs)


def _export_fallback_reason(model: nn.Module, method: str, export_failure: str) -> str:
    """Why a model torch.export cannot trace takes the legacy flow (one line), or a ``ValueError`` when that flow
    cannot trace it either (static and QAT go through FX symbolic tracing; dynamic swaps modules, no tracing)."""
    if method != "dynamic":
        fx = fx_trace_failure(model)
        if fx is not None:
            raise ValueError(f"quant.method={method!r} cannot quantize {type(model).__name__}: the PT2E flow's "
                             f"{export_failure}, and the legacy flow's FX symbolic tracing fails too ({fx}); keep "
                             "data-dependent Python control flow out of forward, or use quant.method='dynamic'")
    how = "swaps modules, nothing traced" if method == "dynamic" else "FX symbolic tracing traces it"
    return f"{export_failure}; the legacy torch.ao flow ({API[method].split(' ')[0]}: {how}) took it"


def _legacy_with_report(model: nn.Module, qc: QuantConfig, calibration_loader: Iterable | None = None, *,
                        finetune: Callable[[nn.Module], Any] | None = None, example_inputs: tuple | None = None
                        ) -> tuple[nn.Module, dict[str, Any]]:
    """The torch.ao path (``quant.flow='legacy'``): eager ``quantize_dynamic``, FX static and QAT."""
    from torch.ao import quantization as tq
    from torch.ao.quantization import quantize_fx

    engine = resolve_engine(qc.backend)
    # The engine is process-global in torch, and packed int8 weights must run under the engine that packed
    # them, so it is set here and left set (recorded in the report).
    torch.backends.quantized.engine = engine
    float_model = copy.deepcopy(model).cpu().eval()
    info: dict[str, Any] = {"method": qc.method, "flow": "legacy", "engine": engine, "api": API[qc.method],
                            "api_reason": API_REASON,
                            "observer": qc.observer if qc.method == "static" else
                            ("moving_average fake-quant" if qc.method == "qat" else "none (dynamic)"),
                            "per_channel": qc.per_channel,
                            "reduce_range": reduce_range_choice(qc.reduce_range, "legacy", engine)
                            if qc.method != "dynamic" else
                            {"used": True, "why": "torch's dynamic int8 Linear always quantizes activations to 7 bits "
                                                  "(reduce_range=True inside quantized.linear_dynamic)"}}
    skip = narrow_embeddings(float_model)
    if skip:
        info["kept_float_on_purpose"] = {n: f"embedding_dim < {MIN_EMBEDDING_DIM}: int8 rows + qparams would be "
                                            "larger than fp32" for n in skip}
    with ao_warnings_filtered():
        if qc.method == "dynamic":
            spec = {nn.Linear: tq.default_dynamic_qconfig, nn.LSTM: tq.default_dynamic_qconfig,
                    nn.GRU: tq.default_dynamic_qconfig, nn.EmbeddingBag: tq.float_qparams_weight_only_qconfig,
                    nn.Embedding: tq.float_qparams_weight_only_qconfig}
            spec.update(dict.fromkeys(skip))  # a module name overrides its type's qconfig: None = stay float
            q = tq.quantize_dynamic(copy.deepcopy(float_model), spec, dtype=torch.qint8)
            anchor = keep_a_float_parameter(float_model, q)  # the model's own forward runs on the int8 modules
            if anchor:
                info["float_parameter_kept"] = {"parameter": anchor, "why": WHY_FLOAT_ANCHOR}
        elif qc.method == "static":
            batches = calibration_batches(calibration_loader, qc.calibration_batches)
            mapping, info["mapping"] = _qconfig_mapping(qc, engine, batches[0], skip)
            prepared = quantize_fx.prepare_fx(copy.deepcopy(float_model), mapping, batches[0])
            with torch.no_grad():
                for inputs in batches:
                    prepared(*inputs)
            info["calibration_batches_used"] = len(batches)
            q = quantize_fx.convert_fx(prepared)
        else:
            if finetune is None:
                raise ValueError("quant.method='qat' needs finetune: a callable that trains the fake-quant model")
            if example_inputs is None:
                example_inputs = calibration_batches(calibration_loader, 1)[0]
            mapping, info["mapping"] = _qconfig_mapping(qc, engine, example_inputs, skip)
            prepared = quantize_fx.prepare_qat_fx(copy.deepcopy(model).train(), mapping, example_inputs)
            finetune(prepared)
            q = quantize_fx.convert_fx(prepared.cpu().eval())
            left = restore_float_leftovers(q)
            if left:
                info["qat_fake_quant_removed"] = left
    contiguous = contiguous_embedding_indices(q)
    if contiguous:
        info["embedding_indices_made_contiguous"] = {"layers": contiguous, "why": WHY_CONTIGUOUS}
    unfused = keep_int8_layers_unfused(q)
    if unfused:
        info["fastpath"] = {"unfused_layers": unfused, "why": WHY_FASTPATH}
    info["swap"] = swap_report(float_model, q, qc.method, info.get("kept_float_on_purpose"))
    check_swapped(info["swap"], qc.method)
    return q.eval(), info

__all__ = [
    "affine_dequantize", "affine_qparams", "affine_quantize", "ao_warnings_filtered", "API_REASON",
    "calibration_batches", "check_fx_traceable", "check_some_flow_traces", "check_supported",
    "contiguous_embedding_indices", "fx_trace_failure", "make_qconfig",
    "quantize", "quantize_with_report", "resolve_engine", "WHY_CONTIGUOUS",
]
