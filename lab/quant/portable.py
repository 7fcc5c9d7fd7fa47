"""Int8 as plain PyTorch (``python -m lab recipe``, :mod:`lab.portable`): the script's ``for_inference(model,
calibration_set)`` returns the int8 model of the trained float model for CPU inference, through the flow the config
names, as :mod:`lab.quant.pt2e` and :mod:`lab.quant.int8` build it.

``pt2e`` (the default): ``torch.export`` (batch dimension dynamic) -> ``prepare_pt2e`` with torchao's
``X86InductorQuantizer`` (per-channel int8 weights, uint8 activations; dynamic: ``nn.Linear`` only) -> calibrate ->
``convert_pt2e`` -> ``torch.compile`` with Inductor freezing, which folds each quantize / dequantize pair around a
layer into one oneDNN int8 kernel (uncompiled, the converted graph is a slower float reference). QAT exports the
trained model in train mode, ``prepare_qat_pt2e``, fine-tunes it with the script's own ``fit`` (fake-quant in the
forward), and ``for_inference`` converts that. ``legacy``: ``torch.ao``'s eager ``quantize_dynamic`` or FX graph mode
static quantization. A dynamic int8 of a model holding an LSTM / GRU takes ``quantize_dynamic`` (PT2E has no int8
RNN), as the lab does. ``quant.flow='auto'`` is a decision (both flows timed on the run's batch): its code is the
flow a stored run took, else the default flow. Activation range (7-bit where the CPU lacks int8 dot products) and
engine are the lab's choice on the machine that writes the script; the header says which.
"""

from __future__ import annotations

import dataclasses

from lab.config import QuantConfig, RunConfig
from lab.quant.int8 import resolve_engine
from lab.quant.numerics import reduce_range_choice
from lab.quant.swap import MIN_EMBEDDING_DIM
from lab.result import RunResult
from lab.technique import NotPortable, Portable

PT2E_IMPORTS = ("import copy", "import itertools", "import torch._inductor.config",
                "from torchao.quantization.pt2e import allow_exported_model_train_eval, move_exported_model_to_eval",
                "from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e, prepare_qat_pt2e",
                "from torchao.quantization.pt2e.quantizer import x86_inductor_quantizer as xiq")
LEGACY_IMPORTS = ("import copy", "from torch.ao import quantization as tq", "import itertools",
                  "from torch.ao.quantization import quantize_fx")
EXPORT = ("dims = tuple({0: torch.export.Dim.AUTO} for _ in example)  # any batch size",
          "graph = torch.export.export(model, example, dynamic_shapes=dims).module()")
COMPILE = ("torch._inductor.config.freezing = True  # Inductor folds quantize / dequantize into one int8 kernel",
           "return torch.compile(int8, dynamic=False)  # call it under torch.no_grad(); a batch size compiles once")
EAGER_DYNAMIC = (
    "spec = {nn.Linear: tq.default_dynamic_qconfig, nn.LSTM: tq.default_dynamic_qconfig,",
    "        nn.GRU: tq.default_dynamic_qconfig, nn.EmbeddingBag: tq.float_qparams_weight_only_qconfig,",
    "        nn.Embedding: tq.float_qparams_weight_only_qconfig}",
    "spec.update({n: None for n, m in model.named_modules()  # narrow tables: int8 rows + scales would be larger",
    f"             if isinstance(m, (nn.Embedding, nn.EmbeddingBag)) and m.embedding_dim < {MIN_EMBEDDING_DIM}}})",
    "return tq.quantize_dynamic(model, spec, dtype=torch.qint8)  # int8 weights; activations quantized per batch")
OBSERVERS = {"histogram": "HistogramObserver", "minmax": "MinMaxObserver",
             "moving_average": "MovingAverageMinMaxObserver"}


def flow_of(qc: QuantConfig, run: RunResult | None) -> tuple[str, str]:
    """``(flow, why)``: the flow ``quant.flow`` stands for in a recipe (``auto``: a stored run's choice, else pt2e)."""
    if qc.flow != "auto":
        return qc.flow, ""
    if run is not None:
        rec = (run.details or {}).get("quant") or {}
        if rec.get("flow") not in ("pt2e", "legacy"):
            raise NotPortable(f"quant.flow='auto': run {run.run_id[:8]} records no flow taken (status {run.status}); "
                              "give a finished run of it")
        why = ((rec.get("auto") or {}).get("why") or "timed both on the run's batch")
        return rec["flow"], f"int8_auto: run {run.run_id[:8]} took the {rec['flow']} flow ({why})"
    return "pt2e", ("int8_auto: the PT2E flow, the lab's default without a measurement; auto times both flows on "
                    "your model's batch and keeps the faster (pass --run RUN_ID of an int8_auto run for its choice)")


def _quantizer(method: str, reduce_range: bool) -> tuple[str, ...]:
    config = f"xiq.get_default_x86_inductor_quantization_config(is_{method}=True)" if method != "static" else \
        "xiq.get_default_x86_inductor_quantization_config()"
    if method == "dynamic":  # Linear only: Inductor has no dynamic int8 convolution
        narrow = ", reduce_range=True" if reduce_range else ""
        return (f"config = xiq.get_default_x86_inductor_quantization_config(is_dynamic=True{narrow})",
                "quantizer = xiq.X86InductorQuantizer().set_module_type_qconfig(nn.Linear, config)")
    lines = [f"quantizer = xiq.X86InductorQuantizer().set_global({config})"]
    if reduce_range:
        qat = "is_qat=True, " if method == "qat" else ""
        # the narrow config named first: inlined, the QAT line ran past 120 columns inside the emitted function
        lines += [f"narrow = xiq.get_default_x86_inductor_quantization_config({qat}reduce_range=True)",
                  "for kind in (nn.Linear, nn.MultiheadAttention):  # 7-bit activations: no VNNI on this CPU",
                  "    quantizer.set_module_type_qconfig(kind, narrow)"]
    return tuple(lines)


def _pt2e(qc: QuantConfig, reduce_range: bool) -> Portable:
    prelude = ("model = copy.deepcopy(model).cpu().eval()  # the float model stays as it was",
               "batches = [tuple(b[:-1]) for b in itertools.islice(DataLoader(calibration_set, batch_size=batch_size), "
               f"{qc.calibration_batches if qc.method == 'static' else 1})]",
               "example = batches[0]", *EXPORT)
    if qc.method == "static":
        body = (*prelude, *_quantizer("static", reduce_range), "prepared = prepare_pt2e(graph, quantizer)",
                "with torch.no_grad():", "    for inputs in batches:",
                "        prepared(*inputs)  # calibrate: observers record every activation's range",
                "int8 = convert_pt2e(prepared)", *COMPILE)
        return Portable(comment=f"static int8 for inference: PT2E (torchao X86InductorQuantizer), calibrated on "
                                f"{qc.calibration_batches} batches, compiled by Inductor", imports=PT2E_IMPORTS,
                        requires=("torchao",), inference=body)
    if qc.method == "dynamic":
        body = ("if any(isinstance(m, nn.RNNBase) for m in model.modules()):  # PT2E has no int8 LSTM / GRU",
                "    model = copy.deepcopy(model).cpu().eval()", *("    " + line for line in EAGER_DYNAMIC),
                *prelude, *_quantizer("dynamic", reduce_range), "prepared = prepare_pt2e(graph, quantizer)",
                "with torch.no_grad():", "    prepared(*example)  # the weight observers run once",
                "int8 = convert_pt2e(prepared)", *COMPILE)
        return Portable(comment="dynamic int8 for inference: PT2E (weights int8 ahead of time, activations quantized "
                                "per batch), compiled by Inductor", imports=(*PT2E_IMPORTS, *LEGACY_IMPORTS[1:2]),
                        requires=("torchao",), inference=body)
    return Portable(
        comment=f"quantization-aware fine-tuning ({qc.qat_epochs} epoch at lr x {qc.qat_lr_factor:g}, fake-quant "
                "int8 in the forward), then int8 through PT2E, compiled by Inductor",
        imports=PT2E_IMPORTS, requires=("torchao",),
        after_training=("# QAT: fake-quant int8 in the forward while fine-tuning: the weights learn the rounding",
                        "model = copy.deepcopy(model).cpu().train()",
                        "example = tuple(t[:2] for t in next(iter(loader))[:-1])", *EXPORT,
                        *_quantizer("qat", reduce_range), "model = prepare_qat_pt2e(graph, quantizer)",
                        "allow_exported_model_train_eval(model)  # fit() calls model.train()",
                        f"fit(model, loader, loss_fn, epochs={qc.qat_epochs}, lr=lr * {qc.qat_lr_factor!r}, "
                        "device=device, phase=\"qat\")"),
        inference=("move_exported_model_to_eval(model)  # the fake-quant model train() returned",
                   "int8 = convert_pt2e(model)  # QAT needs no calibration: its observers ran while fine-tuning",
                   *COMPILE))


def _legacy(qc: QuantConfig) -> Portable:
    engine = resolve_engine(qc.backend)
    head = (f"torch.backends.quantized.engine = {engine!r}  # int8 weights run under the engine that packed them",
            "model = copy.deepcopy(model).cpu().eval()  # the float model stays as it was")
    if qc.method == "dynamic":
        return Portable(comment="dynamic int8 for inference, torch.ao eager quantize_dynamic (no compile)",
                        imports=LEGACY_IMPORTS, inference=(*head, *EAGER_DYNAMIC))
    if qc.method == "qat":
        raise NotPortable("quant.method='qat' with quant.flow='legacy': FX quantization-aware training is not "
                          "written out by the recipe (int8_qat, the PT2E flow, is)")
    act_max = 127 if reduce_range_choice(qc.reduce_range, "legacy", engine)["used"] else 255
    weight = ("PerChannelMinMaxObserver", "per_channel_symmetric") if qc.per_channel else \
        ("MinMaxObserver", "per_tensor_symmetric")
    body = (*head,
            "batches = [tuple(b[:-1]) for b in itertools.islice(DataLoader(calibration_set, batch_size=batch_size), "
            f"{qc.calibration_batches})]",
            f"activation = tq.{OBSERVERS[qc.observer]}.with_args(dtype=torch.quint8, quant_min=0, quant_max={act_max})",
            f"weight = tq.{weight[0]}.with_args(dtype=torch.qint8, qscheme=torch.{weight[1]})",
            "qconfig = tq.QConfig(activation=activation, weight=weight)",
            "if all(t.is_floating_point() for t in batches[0]):",
            "    mapping = tq.QConfigMapping().set_global(qconfig)  # the ops between layers run int8 too",
            "else:  # integer inputs (ids): quantize the layers, never the index arithmetic",
            "    mapping = tq.QConfigMapping()",
            "    for layer in (nn.Linear, nn.Conv2d, nn.ReLU, nn.BatchNorm1d, nn.BatchNorm2d):",
            "        mapping.set_object_type(layer, qconfig)",
            "for table in (nn.EmbeddingBag, nn.Embedding):",
            "    mapping.set_object_type(table, tq.float_qparams_weight_only_qconfig)",
            "prepared = quantize_fx.prepare_fx(model, mapping, batches[0])",
            "with torch.no_grad():", "    for inputs in batches:",
            "        prepared(*inputs)  # calibrate: observers record every activation's range",
            "return quantize_fx.convert_fx(prepared)")
    return Portable(comment=f"static int8 for inference, torch.ao FX graph mode, calibrated on "
                            f"{qc.calibration_batches} batches (eager int8 kernels, no compile)",
                    imports=LEGACY_IMPORTS, inference=body)


def portable(cfg: RunConfig, run: RunResult | None = None) -> Portable | None:
    """``for_inference`` through the config's flow (and, for QAT, the fake-quant fine-tune after training)."""
    qc = cfg.quant
    if not qc.enabled:
        return None
    flow, why = flow_of(qc, run)
    if flow == "legacy":
        part = _legacy(qc)
    else:
        if qc.method != "dynamic" and qc.observer != QuantConfig().observer or not qc.per_channel:
            raise NotPortable("quant.observer / quant.per_channel are legacy-flow knobs (PT2E's default config is "
                              "histogram + per-channel): use --quant-flow legacy")
        rr = reduce_range_choice(qc.reduce_range, "pt2e")
        part = _pt2e(qc, rr["used"])
        why = "; ".join(w for w in (why, f"activations: {rr['why']}") if w)
    return dataclasses.replace(part, notes=(*part.notes, why)) if why else part


__all__ = ["flow_of", "portable"]
