"""Physical structured pruning: remove whole output channels / neurons and rebuild smaller dense layers.

Why physical: a mask of zeros leaves a dense kernel doing the same work, so only a layer that is really
narrower runs faster. Removing output channel ``c`` of one layer means removing input channel ``c`` of
every layer that reads it, its BatchNorm entries, and, across a ResNet's residual adds, the same channel
of every tensor summed with it. That dependency tracking is what Torch-Pruning (``torch_pruning``, Fang
et al., CVPR 2023) does by tracing the model, so the lab uses it instead of re-deriving the graph.

What is structurally prunable in the lab's workloads (the output layer is never pruned: its width is the
number of classes):

- ``vision`` (ResNet): every Conv2d (stem, block convs, shortcut convs), BN and residual groups kept
  consistent by Torch-Pruning; the final ``fc`` only loses input columns.
- ``ctr`` (DLRM): the hidden Linear layers of the bottom and top MLPs. The bottom MLP's last layer must
  keep ``embed_dim`` outputs (they meet the embeddings in the pairwise ``bmm``), and the ``EmbeddingBag``
  tables are not channel-prunable, so each MLP is pruned as its own sub-graph: the workload says so through
  its ``Workload.prune_scopes`` hook, passed here as ``scopes`` (this module knows no workload class).
- ``sequence`` (LSTM): nothing. Removing hidden units of ``nn.LSTM`` means slicing four gate blocks in
  ``weight_ih``/``weight_hh``/biases consistently; the lab excludes it rather than hand-roll that, and the
  only Linear left is the output head, so structured pruning of this model is refused with a clear error.
  ``nn.GRU`` / ``nn.RNN`` likewise.

Standard blocks in user models:

- ``nn.TransformerEncoderLayer``: the feed-forward's hidden width (``linear1`` outputs, ``linear2`` inputs).
  ``linear2`` and ``self_attn.out_proj`` write the residual stream, whose width every layer, LayerNorm, the
  embedding and any positional table share, so they keep their width. ``nn.MultiheadAttention`` is left whole:
  Torch-Pruning 1.6 prunes it only along ``embed_dim`` (that same residual width), not by heads.
- Attention with separate q / k / v Linear layers of a known layout (:data:`HEAD_LAYOUTS`: BERT, DistilBERT,
  ViT): whole heads are removed (ranked by L1 norm), never an uneven mix of channels across heads; an
  attention module of unknown layout keeps its full width, named in the record.
- Depthwise convolutions (``groups == channels``) and squeeze-excitation gates: Torch-Pruning couples the
  depthwise channels with their input and the gate's output with the channels it scales.
- Weight tying: every module holding a shared Parameter keeps its output width, and the ties are checked
  after pruning (a broken tie is an error, never a silent untying).
- BatchNorm: Torch-Pruning keeps the running mean / variance of each kept channel, but those statistics were
  measured on the dense model, whose layers read the inputs pruning removed; they no longer describe the pruned
  activations. :func:`recalibrate_batchnorm` re-estimates them on training batches before the fine-tune (HF
  ResNet at 50 %: 0.53 -> 0.86 accuracy before any gradient step).

Notebook: ``notebooks/03_pruning.ipynb``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from lab.measure import hooks_removed
from lab.workloads.hf import is_conv1d

#: ``fn(model) -> [(prefix, sub-module, layers whose output width is fixed)]``: ``Workload.prune_scopes``.
ScopesFn = Callable[[nn.Module], list[tuple[str, nn.Module, list[nn.Module]]]]

#: Layers whose output channels can be removed.
CHANNEL_TYPES: tuple[type[nn.Module], ...] = (nn.Conv2d, nn.Linear)
#: Layers never structurally pruned here (see the module docstring).
EXCLUDED_TYPES: tuple[type[nn.Module], ...] = (nn.RNNBase, nn.Embedding, nn.EmbeddingBag, nn.MultiheadAttention)
WHY_RNN = ("hidden units span the gate blocks of weight_ih/weight_hh, which Torch-Pruning does not slice for "
           "RNNs")
WHY_EMBEDDING = "embedding tables are not channel-pruned (their width is the input of every reader)"
WHY_ATTENTION = ("Torch-Pruning 1.6 prunes nn.MultiheadAttention only along embed_dim (the residual stream), not "
                 "by heads")
WHY_RESIDUAL = "writes the residual stream of a Transformer layer, whose width the embedding and every layer share"
WHY_OUTPUT = "the output layer: its width is the number of outputs"
WHY_TIED = "holds a Parameter shared with another module (weight tying)"
WHY_FEEDS_TIED = ("its output channels are the input width of {reader}, whose Parameter is shared with another "
                  "module (weight tying): pruning them would untie it")
WHY_CONV1D = ("a Hugging Face Conv1D (GPT-2 style, weight [in, out]): Torch-Pruning traces nn.Linear / Conv2d "
              "layers only, and GPT-2's c_attn packs the q, k, v of every head into one output; not channel-pruned")
WHY_HEADS_UNKNOWN = ("inside an attention whose heads the lab does not recognise (lab.pruning.channels.HEAD_LAYOUTS: "
                     "separate q / k / v Linears of equal width and a head count): pruning its channels would mix "
                     "heads")
WHY_ATTN_OUT = "the attention's output projection writes the residual stream: its heads' input columns go with them"

#: Attention layouts whose heads are removed whole (HF BERT-style, HF DistilBERT, HF ViT / Llama-style without
#: grouped k / v): (q, k, v child names, output projection: a child name or ``"../output.dense"`` beside the
#: attention, head-count attribute). Each of these reshapes q / k / v as ``(..., -1, head_dim)``.
HEAD_LAYOUTS: tuple[tuple[str, str, str, str, str], ...] = (
    ("query", "key", "value", "../output.dense", "num_attention_heads"),
    ("q_lin", "k_lin", "v_lin", "out_lin", "n_heads"),
    ("q_proj", "k_proj", "v_proj", "o_proj", "num_attention_heads"),
    ("q_proj", "k_proj", "v_proj", "out_proj", "num_heads"),
)


@dataclass
class Heads:
    """One multi-head attention as separate q / k / v / output Linears, ``heads`` of ``head_dim`` channels."""

    name: str
    module: nn.Module
    q: nn.Linear
    k: nn.Linear
    v: nn.Linear
    out: nn.Linear
    heads: int
    head_dim: int
    heads_attr: str

    def linears(self) -> list[nn.Linear]:
        return [self.q, self.k, self.v, self.out]


def attention_heads(model: nn.Module) -> list[Heads]:
    """Every attention of ``model`` laid out as in :data:`HEAD_LAYOUTS` (found by child names and a head count)."""
    mods = dict(model.named_modules())
    found = []
    for name, m in mods.items():
        for q, k, v, out, attr in HEAD_LAYOUTS:
            lins = [getattr(m, c, None) for c in (q, k, v)]
            heads = getattr(m, attr, None)
            if not (all(isinstance(x, nn.Linear) for x in lins) and isinstance(heads, int) and heads > 0):
                continue
            if out.startswith("../"):
                parent = name.rpartition(".")[0]
                o = mods.get(f"{parent}.{out[3:]}" if parent else out[3:])
            else:
                o = getattr(m, out, None)
            width = lins[0].out_features
            if isinstance(o, nn.Linear) and width % heads == 0 and o.in_features == width and all(
                    x.out_features == width for x in lins):
                found.append(Heads(name, m, *lins, o, heads, width // heads, attr))
            break
    return found


def prune_heads(groups: list[Heads], amount: float, norm: int = 1) -> dict[str, list[int]]:
    """Remove whole heads: per attention, keep the ``max(1, round(heads * (1 - amount)))`` heads whose q, k, v
    rows and output columns have the largest L``norm`` norm, slicing the four Linears in place (each kept head's
    channels, in their order) and updating the head count; returns ``{attention: kept head indices}``. A kept
    head computes exactly what it computed before (same q / k / v rows, same scaling, same output columns)."""
    kept_by: dict[str, list[int]] = {}
    for g in groups:
        d, n_keep = g.head_dim, max(1, round(g.heads * (1.0 - amount)))
        with torch.no_grad():
            score = sum(lin.weight.detach().reshape(g.heads, d, -1).abs().pow(norm).sum((1, 2))
                        for lin in (g.q, g.k, g.v))
            score = score + g.out.weight.detach().reshape(g.out.out_features, g.heads, d).abs().pow(norm).sum((0, 2))
        kept = sorted(torch.topk(score, n_keep).indices.tolist())
        idx = torch.cat([torch.arange(h * d, (h + 1) * d) for h in kept]).to(g.q.weight.device)
        with torch.no_grad():
            for lin in (g.q, g.k, g.v):
                lin.weight = nn.Parameter(lin.weight.detach()[idx].clone())
                if lin.bias is not None:
                    lin.bias = nn.Parameter(lin.bias.detach()[idx].clone())
                lin.out_features = len(idx)
            g.out.weight = nn.Parameter(g.out.weight.detach()[:, idx].clone())
            g.out.in_features = len(idx)
        setattr(g.module, g.heads_attr, n_keep)
        if isinstance(getattr(g.module, "all_head_size", None), int):
            g.module.all_head_size = len(idx)
        kept_by[g.name] = kept
    return kept_by


def _excluded_reason(m: nn.Module) -> str:
    if isinstance(m, nn.RNNBase):
        return WHY_RNN
    if isinstance(m, nn.MultiheadAttention):
        return WHY_ATTENTION
    return WHY_EMBEDDING


def _fixed_with_reasons(model: nn.Module) -> dict[int, tuple[nn.Module, str]]:
    """``id -> (module, reason)`` for the layers of ``model`` whose output width must stay (the default scope)."""
    fixed: dict[int, tuple[nn.Module, str]] = {}
    out = _output_layer(model)
    if out is not None:
        fixed[id(out)] = (out, WHY_OUTPUT)
    for m in model.modules():
        if isinstance(m, EXCLUDED_TYPES):
            fixed[id(m)] = (m, _excluded_reason(m))
        if isinstance(m, nn.MultiheadAttention):
            fixed.setdefault(id(m.out_proj), (m.out_proj, WHY_ATTENTION))
        if isinstance(m, (nn.TransformerEncoderLayer, nn.TransformerDecoderLayer)):
            fixed.setdefault(id(m.linear2), (m.linear2, WHY_RESIDUAL))
        if is_conv1d(m):
            fixed.setdefault(id(m), (m, WHY_CONV1D))
    known = {id(lin) for g in attention_heads(model) for lin in g.linears()}
    for g in attention_heads(model):
        fixed.setdefault(id(g.out), (g.out, WHY_ATTN_OUT))
    for m in model.modules():
        if type(m).__name__.endswith("Attention") and not isinstance(m, nn.MultiheadAttention):
            for c in m.modules():
                if isinstance(c, CHANNEL_TYPES) and id(c) not in known:
                    fixed.setdefault(id(c), (c, WHY_HEADS_UNKNOWN))
    shared = _shared_parameter_owners(model)
    for owners in shared:
        for m in owners:
            fixed.setdefault(id(m), (m, WHY_TIED))
    return fixed


def _shared_parameter_owners(model: nn.Module) -> list[list[nn.Module]]:
    """Per Parameter registered on more than one module: those modules."""
    by_param: dict[int, list[nn.Module]] = {}
    for m in model.modules():
        for p in m._parameters.values():
            if p is not None and m not in by_param.setdefault(id(p), []):
                by_param[id(p)].append(m)
    return [ms for ms in by_param.values() if len(ms) > 1]


def tie_feeders(model: nn.Module, example_inputs: tuple | None) -> dict[int, tuple[nn.Module, str]]:
    """``id -> (layer, reason)`` for the Linear / Conv2d layers whose output channels reach a module holding a
    shared Parameter (nanoGPT's ``lm_head.weight = wte.weight``: the layer before the head sets the head's input
    width, and so the embedding's). Torch-Pruning's dependency graph says which; empty without ties or inputs."""
    tied = {id(m): m for owners in _shared_parameter_owners(model) for m in owners}
    if not tied or example_inputs is None:
        return {}
    import torch_pruning as tp

    names = {id(m): n for n, m in model.named_modules()}
    was_training = model.training
    model.eval()
    try:
        graph = tp.DependencyGraph().build_dependency(model, example_inputs=example_inputs)
    except (TypeError, RuntimeError, ValueError, AttributeError):
        # a whole model Torch-Pruning cannot trace (Hugging Face GPT-2: its index mapping meets a None): no layer
        # is known to feed the tie, and the tie check after pruning (_tie_signature) still refuses a broken one
        return {}
    finally:
        model.train(was_training)
    out: dict[int, tuple[nn.Module, str]] = {}
    for m in model.modules():
        if not isinstance(m, CHANNEL_TYPES) or id(m) in tied:
            continue
        prune_out = tp.prune_linear_out_channels if isinstance(m, nn.Linear) else tp.prune_conv_out_channels
        readers = {id(d.target.module) for d, _ in graph.get_pruning_group(m, prune_out, idxs=[0])} & tied.keys()
        if readers:
            reader = ", ".join(sorted(names.get(i, "?") for i in readers))
            out[id(m)] = (m, WHY_FEEDS_TIED.format(reader=reader))
    return out


def _tie_signature(model: nn.Module) -> list[list[tuple[nn.Module, str]]]:
    """The (module, attribute) pairs of every shared Parameter, to check that pruning kept each tie."""
    by_param: dict[int, list[tuple[nn.Module, str]]] = {}
    for m in model.modules():
        for name, p in m._parameters.items():
            if p is not None:
                by_param.setdefault(id(p), []).append((m, name))
    return [pairs for pairs in by_param.values() if len({id(m) for m, _ in pairs}) > 1]


def _matches(name: str, module: nn.Module, patterns: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") or type(module).__name__ == p for p in patterns)


def _output_layer(model: nn.Module) -> nn.Module | None:
    """The last channel layer in definition order: the classifier / logit head, whose width is fixed."""
    last = None
    for m in model.modules():
        if isinstance(m, CHANNEL_TYPES):
            last = m
    return last


def structural_scopes(model: nn.Module, scopes: ScopesFn | None = None) -> list[tuple[str, nn.Module, list[nn.Module]]]:
    """``(prefix, sub-graph, layers whose outputs must keep their width)`` for each part of ``model`` that
    is pruned as one traced graph: what ``scopes`` (the workload's ``prune_scopes`` hook) says, else the
    whole model without its output layer (and with its RNNs and embeddings left alone)."""
    if scopes is not None:
        return scopes(model)
    return [("", model, [m for m, _ in _fixed_with_reasons(model).values()])]


def channel_exclusions(model: nn.Module, scopes: ScopesFn | None = None,
                       example_inputs: tuple | None = None) -> dict[str, str]:
    """``{layer: reason}`` for the layers ``structured_channels`` leaves at full width (the output layer,
    RNNs, embeddings, attention, Transformer residual writers, tied layers and, with ``example_inputs``, the
    layers feeding a tied one), for ``details["pruning"]``."""
    names = {id(m): n for n, m in model.named_modules()}
    if scopes is None:
        fixed = {**tie_feeders(model, example_inputs), **_fixed_with_reasons(model)}
        return {names[i]: why for i, (_, why) in fixed.items() if i in names}
    out: dict[str, str] = {}
    for _, _, fixed in scopes(model):
        for m in fixed:
            out[names.get(id(m), type(m).__name__)] = "kept at full width by the workload's prune_scopes"
    return out


def channel_prunable_layers(model: nn.Module, layers: tuple[str, ...] = (),
                            scopes: ScopesFn | None = None, example_inputs: tuple | None = None
                            ) -> dict[str, nn.Module]:
    """Qualified names of the layers whose output channels ``structured_channels`` would remove, filtered
    by ``layers`` (names or type names; ``()`` = all); with ``example_inputs``, minus the layers that feed a tied
    one (:func:`tie_feeders`). Raises ValueError for a pattern that matches nothing or only layers that cannot
    be channel-pruned, and when nothing is left to prune."""
    out: dict[str, nn.Module] = {}
    feeders = tie_feeders(model, example_inputs) if scopes is None else {}
    for prefix, scope, fixed in structural_scopes(model, scopes):
        fixed_ids = {id(m) for m in fixed} | feeders.keys()
        for name, m in scope.named_modules():
            qual = f"{prefix}.{name}" if prefix and name else (prefix or name)
            if isinstance(m, CHANNEL_TYPES) and id(m) not in fixed_ids:
                out[qual] = m
    all_names = dict(model.named_modules())
    for p in layers:
        hits = {n: m for n, m in all_names.items() if n and _matches(n, m, (p,))}
        if not hits:
            raise ValueError(f"prune.layers entry {p!r} matches no module; modules: "
                             + ", ".join(n for n in all_names if n)[:400])
        if not any(n in out for n in hits) and not any(
                any(k == n or k.startswith(n + ".") for k in out) for n in hits):
            kinds = sorted({type(m).__name__ for m in hits.values()})
            raise ValueError(f"prune.layers entry {p!r} ({', '.join(kinds)}) is not structurally prunable: "
                             "structured_channels removes output channels of Conv2d/Linear layers other than "
                             "the output layer; LSTM, GRU, embeddings, attention and the output layer are excluded")
    if layers:
        out = {n: m for n, m in out.items() if _matches(n, m, layers)}
    if not out:
        why = "; ".join(f"{n}: {r}" for n, r in channel_exclusions(model, scopes, example_inputs).items())
        raise ValueError(f"structured_channels: {type(model).__name__} has no structurally prunable layer "
                         "(only Conv2d/Linear layers before the output layer qualify; LSTM, GRU, embeddings and "
                         f"attention are excluded){': ' + why if why else ''}")
    return out


def _scope_inputs(model: nn.Module, scopes: list[nn.Module], example_inputs: tuple) -> dict[int, tuple]:
    """The positional inputs each scope receives when ``model`` runs ``example_inputs``."""
    seen: dict[int, tuple] = {}
    handles = [s.register_forward_pre_hook(lambda mod, args: seen.setdefault(id(mod), args)) for s in scopes]
    with hooks_removed(handles), torch.no_grad():
        model(*example_inputs)
    return seen


def prune_channels(model: nn.Module, amount: float, *, example_inputs: tuple, norm: int = 1,
                   layers: tuple[str, ...] = (), scopes: ScopesFn | None = None) -> dict[str, Any]:
    """Remove ``amount`` of the output channels of each prunable layer (ranked by the L``norm`` norm of
    the channel's whole dependency group) in place; returns ``{layer: [channels before, after]}``."""
    import torch_pruning as tp  # heavy import, only when structured pruning is used

    if not 0.0 <= amount < 1.0:
        raise ValueError(f"prune.amount={amount!r} is invalid: structured pruning needs 0 <= amount < 1")
    targets = channel_prunable_layers(model, layers, scopes, example_inputs)
    target_ids = {id(m) for m in targets.values()}
    before = {n: int(m.weight.shape[0]) for n, m in targets.items()}
    if amount == 0.0:
        return {n: [c, c] for n, c in before.items()}
    was_training = model.training
    model.eval()
    parts = structural_scopes(model, scopes)
    ties = _tie_signature(model)
    inputs = _scope_inputs(model, [s for _, s, _ in parts], example_inputs)
    # attention first, by whole heads (never an uneven mix of channels across heads), then the rest by channels
    heads = attention_heads(model)
    prune_heads([g for g in heads if id(g.q) in target_ids], amount, norm)
    head_linears = {id(lin) for g in heads for lin in g.linears()}
    for _, scope, _fixed in parts:
        roots = [m for m in scope.modules() if isinstance(m, CHANNEL_TYPES)]
        if not any(id(m) in target_ids and id(m) not in head_linears for m in roots):
            continue
        ignored = [m for m in roots if id(m) not in target_ids or id(m) in head_linears]
        ignored += [m for m in scope.modules() if isinstance(m, EXCLUDED_TYPES) or is_conv1d(m)]
        pruner = tp.pruner.MetaPruner(scope, inputs[id(scope)], importance=tp.importance.MagnitudeImportance(p=norm),
                                      pruning_ratio=amount, ignored_layers=ignored,
                                      root_module_types=[nn.Conv2d, nn.Linear])
        pruner.step()
    model.train(was_training)
    for pairs in ties:
        if len({id(getattr(m, name, None)) for m, name in pairs}) > 1:
            raise RuntimeError("structured_channels untied a shared Parameter ("
                               + ", ".join(f"{type(m).__name__}.{name}" for m, name in pairs) + "); refusing to "
                               "return a model whose tied layers now differ")
    return {n: [before[n], int(m.weight.shape[0])] for n, m in targets.items()}

def recalibrate_batchnorm(model: nn.Module, tensors: tuple[torch.Tensor, ...], batch_size: int,
                          device: torch.device, max_batches: int = 16) -> int:
    """Re-estimate every BatchNorm's running statistics on up to ``max_batches`` training batches (``tensors``:
    inputs then target, the target unused), as a cumulative average, with the rest of the model in eval mode (no
    dropout) and no gradients; returns how many BatchNorm layers were recalibrated. Why: after channels are
    removed, the stored statistics are the dense model's, and in eval mode a BatchNorm with stale statistics
    shifts and rescales every kept channel (the pruned accuracy and the fine-tune's starting point)."""
    bns = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats]
    if not bns:
        return 0
    was_training, momenta = model.training, [m.momentum for m in bns]
    model.eval()
    for m in bns:
        m.reset_running_stats()
        m.momentum = None  # cumulative average over the batches seen
        m.train()
    n = len(tensors[0])
    try:
        with torch.no_grad():
            for i in range(0, min(n, batch_size * max_batches), batch_size):
                if min(batch_size, n - i) > 1:  # a batch of one has no variance
                    model(*(t[i:i + batch_size].to(device) for t in tensors[:-1]))
    finally:
        for m, mom in zip(bns, momenta, strict=True):
            m.momentum = mom
        model.train(was_training)
    return len(bns)


__all__ = [
    "attention_heads", "channel_exclusions", "channel_prunable_layers", "HEAD_LAYOUTS", "Heads", "prune_channels",
    "prune_heads", "recalibrate_batchnorm", "ScopesFn", "structural_scopes",
]
