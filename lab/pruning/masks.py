"""Unstructured pruning through ``torch.nn.utils.prune``: which weights, masks to an exact sparsity, baking
them in, and the per-layer report (sparsity, MACs if zeros were skipped, sparse-format bytes).

Why masks through the library: ``prune.l1_unstructured`` & co. reparametrise ``weight`` as ``weight_orig *
weight_mask``, so the forward pass, the backward pass and therefore the optimizer all see the zeros; a
pruned weight receives a zero gradient and stays at zero. Seed 004's loop instead multiplies ``param.grad``
by a mask by hand, which breaks as soon as the optimizer has momentum or weight decay (and it reads
``.grad`` before any backward). A mask skips no work on a dense kernel, so unstructured sparsity gives
~1.0x speed however many zeros it holds; only removing channels (:mod:`lab.pruning.channels`) makes layers
smaller.

A mask only applies where the masked module's forward runs, because ``torch.nn.utils.prune`` recomputes
``weight = weight_orig * weight_mask`` in a forward pre-hook. ``nn.MultiheadAttention`` never calls its
``out_proj`` (``F.multi_head_attention_forward`` reads ``out_proj.weight``), so the attention gets a pre-hook
that recomputes its ``out_proj`` mask (:class:`ApplyChildMasks`), and its own ``in_proj_weight`` is masked
on the attention module itself. Any other weight whose module never runs (a parent reading it directly), and
any weight shared by several modules (weight tying), cannot carry a mask that means what it says: they are
left out of the default selection with the reason (:func:`excluded_weights`) and refused when named.
"""

from __future__ import annotations

import copy
import io
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn.utils import prune as tprune

from lab.config import PruneConfig, RunConfig
from lab.measure import evaluation_mode
from lab.pruning.channels import ScopesFn, prune_channels
from lab.workloads.hf import is_conv1d  # a HF Conv1D's weight is a plain Parameter its forward reads: maskable

#: Layer types whose weights can carry an unstructured mask (embeddings only when named in ``layers``).
MASKABLE_TYPES: tuple[type[nn.Module], ...] = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.LSTM, nn.GRU, nn.Embedding,
                                               nn.EmbeddingBag, nn.MultiheadAttention)
DEFAULT_TYPES: tuple[type[nn.Module], ...] = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.LSTM, nn.GRU,
                                              nn.MultiheadAttention)
UNSTRUCTURED = PruneConfig.MASK_METHODS
#: Measured below this fraction of the theoretical ratio earns a "why" tag.
SHORTFALL = 0.7

Target = tuple[str, nn.Module, str]  # (module name, module, parameter name)


def _pcfg(cfg: RunConfig | PruneConfig) -> PruneConfig:
    return cfg.prune if isinstance(cfg, RunConfig) else cfg


def _weight_names(module: nn.Module) -> list[str]:
    if isinstance(module, nn.RNNBase):  # the flat-weight names survive the ``*_orig`` reparametrisation
        return [n for n in module._flat_weights_names if n.startswith("weight")]
    if isinstance(module, nn.MultiheadAttention):  # out_proj is a Linear child, masked as its own target
        return ["in_proj_weight"] if module._qkv_same_embed_dim else ["q_proj_weight", "k_proj_weight",
                                                                      "v_proj_weight"]
    return ["weight"]


def _qual(name: str, weight: str) -> str:
    return f"{name}.{weight}" if name else weight


def _owners(model: nn.Module) -> dict[int, list[str]]:
    """``id(parameter) -> every "module.param" name it is registered under`` (a tied weight has several)."""
    out: dict[int, list[str]] = {}
    for n, m in model.named_modules(remove_duplicate=False):
        for pn, p in m._parameters.items():
            if p is not None:
                names = out.setdefault(id(p), [])
                if _qual(n, pn) not in names:
                    names.append(_qual(n, pn))
    return out


def _shared_reason(model: nn.Module, module: nn.Module, name: str, weight: str,
                   owners: dict[int, list[str]]) -> str | None:
    p = module._parameters.get(weight)
    if p is None:  # already reparametrised: the mask's owner is the one holding ``*_orig``
        p = module._parameters.get(weight + "_orig")
    others = [o for o in owners.get(id(p), []) if o not in (_qual(name, weight), _qual(name, weight + "_orig"))]
    if p is None or not others:
        return None
    return (f"{_qual(name, weight)} is the same Parameter as {', '.join(others)} (weight tying): a mask on one "
            "owner would leave the other dense and untie them")


def _reached(model: nn.Module, modules: list[nn.Module], example_inputs: tuple) -> set[int]:
    """ids of the modules whose forward runs (or, for an attention's ``out_proj``, whose attention runs)
    in one eval-mode, no-grad forward of ``example_inputs``; modes restored."""
    ran: set[int] = set()
    watch = {id(m) for m in modules}
    handles = []
    for m in model.modules():
        if id(m) in watch or isinstance(m, nn.MultiheadAttention):
            handles.append(m.register_forward_pre_hook(lambda mod, args: ran.add(id(mod))))
    try:
        with evaluation_mode(model):
            model(*example_inputs)
    finally:
        for h in handles:
            h.remove()
    for m in model.modules():
        if isinstance(m, nn.MultiheadAttention) and id(m) in ran:
            ran.add(id(m.out_proj))  # ApplyChildMasks recomputes its mask when the attention runs
    return ran


def excluded_weights(model: nn.Module, layers: tuple[str, ...] = (), example_inputs: tuple | None = None
                     ) -> dict[str, str]:
    """``{"module.weight": reason}`` for the weights of the selection (``layers``, ``()`` = the default
    types) that cannot carry a mask that means what it says: a weight shared with another module (weight
    tying), and, given ``example_inputs``, a module whose forward never runs (its parent reads the weight
    directly). The default selection leaves them out; naming them in ``layers`` is an error."""
    candidates = _select(model, layers)
    owners = _owners(model)
    out = {}
    for n, m in candidates.items():
        for w in _weight_names(m):
            reason = _shared_reason(model, m, n, w, owners)
            if reason:
                out[_qual(n, w)] = reason
    if example_inputs is not None:
        ran = _reached(model, list(candidates.values()), example_inputs)
        for n, m in candidates.items():
            if id(m) not in ran:
                for w in _weight_names(m):
                    out.setdefault(_qual(n, w), f"{n} ({type(m).__name__}) never runs its forward (its parent "
                                                "reads the weight directly), so a mask's pre-hook would not apply")
    return out


def _maskable(m: nn.Module, types: tuple[type[nn.Module], ...]) -> bool:
    return isinstance(m, types) or is_conv1d(m)


def _select(model: nn.Module, layers: tuple[str, ...]) -> dict[str, nn.Module]:
    named = [(n, m) for n, m in model.named_modules() if n or _maskable(m, MASKABLE_TYPES)]
    chosen: dict[str, nn.Module] = {}
    if not layers:
        chosen = {n: m for n, m in named if _maskable(m, DEFAULT_TYPES)}
    for p in layers:
        hits = [(n, m) for n, m in named if n == p or n.startswith(p + ".") or type(m).__name__ == p]
        if not hits:
            raise ValueError(f"prune.layers entry {p!r} matches no module; modules: "
                             + ", ".join(n for n, _ in named)[:400])
        ok = {n: m for n, m in hits if _maskable(m, MASKABLE_TYPES)}
        if not ok:
            kinds = sorted({type(m).__name__ for _, m in hits})
            raise ValueError(f"prune.layers entry {p!r} ({', '.join(kinds)}) is not prunable: supported types are "
                             + ", ".join(t.__name__ for t in MASKABLE_TYPES) + ", Hugging Face Conv1D")
        chosen.update(ok)
    return chosen


def prunable_weights(model: nn.Module, layers: tuple[str, ...] = (), example_inputs: tuple | None = None
                     ) -> list[Target]:
    """The weights an unstructured method prunes: every Linear/Conv/LSTM/GRU/MultiheadAttention weight when
    ``layers`` is empty, else those of the modules named (or of the type named) in ``layers``, containers
    expanded; minus :func:`excluded_weights` (with ``example_inputs``, also the modules that never run).
    Raises ValueError naming an entry that matches nothing or only unsupported module types, a named weight
    that cannot be masked (and why), or a selection left empty."""
    chosen = _select(model, layers)
    excluded = excluded_weights(model, layers, example_inputs)
    if layers and excluded:
        name, why = next(iter(excluded.items()))
        raise ValueError(f"prune.layers={list(layers)!r} selects {name}, which cannot be masked: {why}; "
                         "leave it out of prune.layers")
    targets = [(n, m, w) for n, m in chosen.items() for w in _weight_names(m) if _qual(n, w) not in excluded]
    if not targets:
        why = "; ".join(f"{k}: {v}" for k, v in excluded.items())
        raise ValueError(f"{type(model).__name__} has no prunable weights (supported: "
                         + ", ".join(t.__name__ for t in MASKABLE_TYPES) + ", Hugging Face Conv1D)"
                         + (f"; excluded: {why}" if why else ""))
    return targets


class ApplyChildMasks:
    """Forward pre-hook on an ``nn.MultiheadAttention``: recompute the masked weights of its ``out_proj``.
    The attention never calls ``out_proj`` (``F.multi_head_attention_forward`` reads ``out_proj.weight``), so
    the mask's own pre-hook never fires; without this, training would reuse one masked tensor, and its graph,
    across steps ("backward through the graph a second time") and evaluation would see stale weights."""

    def __call__(self, module: nn.Module, args: tuple) -> None:
        child = module.out_proj
        for hook in list(child._forward_pre_hooks.values()):
            if isinstance(hook, tprune.BasePruningMethod):
                hook(child, args)


def attach_mask_refresh(model: nn.Module) -> None:
    """Give every attention whose ``out_proj`` carries a mask an :class:`ApplyChildMasks` pre-hook (once)."""
    for m in model.modules():
        if not isinstance(m, nn.MultiheadAttention):
            continue
        masked = any(isinstance(h, tprune.BasePruningMethod) for h in m.out_proj._forward_pre_hooks.values())
        if masked and not any(isinstance(h, ApplyChildMasks) for h in m._forward_pre_hooks.values()):
            m.register_forward_pre_hook(ApplyChildMasks())


def _mask(module: nn.Module, name: str) -> torch.Tensor | None:
    m = getattr(module, name + "_mask", None)
    return m if isinstance(m, torch.Tensor) else None


def _n_masked(module: nn.Module, name: str) -> int:
    m = _mask(module, name)
    return 0 if m is None else int((m == 0).sum())


def _numel(module: nn.Module, name: str) -> int:
    orig = getattr(module, name + "_orig", None)
    return (orig if orig is not None else getattr(module, name)).numel()


def set_sparsity(model: nn.Module, pcfg: PruneConfig, sparsity: float,
                 targets: list[Target] | None = None) -> None:
    """Extend the masks so that ``sparsity`` of the targeted weights are pruned (per layer, or over all of
    them for ``global_unstructured``). Already-pruned weights stay pruned: each call prunes an exact count
    of the remaining ones, which is how ``torch.nn.utils.prune`` stacks methods (PruningContainer)."""
    targets = targets if targets is not None else prunable_weights(model, pcfg.layers)
    if pcfg.method == "global_unstructured":
        total = sum(_numel(m, w) for _, m, w in targets)
        extra = round(sparsity * total) - sum(_n_masked(m, w) for _, m, w in targets)
        if extra > 0:
            tprune.global_unstructured([(m, w) for _, m, w in targets], pruning_method=tprune.L1Unstructured,
                                       amount=extra)
        attach_mask_refresh(model)
        return
    fn = {"l1_unstructured": tprune.l1_unstructured, "random_unstructured": tprune.random_unstructured}.get(
        pcfg.method)
    if fn is None:
        raise ValueError(f"prune.method={pcfg.method!r} is invalid here: masks are for " + ", ".join(UNSTRUCTURED))
    for _, m, w in targets:
        extra = round(sparsity * _numel(m, w)) - _n_masked(m, w)
        if extra > 0:
            fn(m, w, amount=extra)
    attach_mask_refresh(model)


def prune(model: nn.Module, cfg: RunConfig | PruneConfig, *, example_inputs: tuple | None = None,
          scopes: ScopesFn | None = None) -> nn.Module:
    """Prune ``model`` in place to ``cfg.prune.amount`` in one shot and return it. Unstructured methods add
    masks (call :func:`make_permanent` to bake them in); ``structured_channels`` rebuilds smaller layers
    and needs ``example_inputs`` (one batch) so the dependency graph can be traced, and ``scopes`` (the
    workload's ``prune_scopes``) for a model that is not traced as one graph."""
    pcfg = _pcfg(cfg)
    if pcfg.method == "none":
        return model
    if pcfg.method == "structured_channels":
        if example_inputs is None:
            raise ValueError("prune.method='structured_channels' needs example_inputs (one batch) to trace "
                             "the model's channel dependencies")
        prune_channels(model, pcfg.amount, example_inputs=example_inputs, norm=pcfg.norm, layers=pcfg.layers,
                       scopes=scopes)
        return model
    set_sparsity(model, pcfg, pcfg.amount, prunable_weights(model, pcfg.layers, example_inputs))
    return model


def make_permanent(model: nn.Module) -> nn.Module:
    """Bake every ``torch.nn.utils.prune`` mask into its weight and drop ``*_orig`` / ``*_mask``, so the
    checkpoint is a plain state dict again (loadable with ``weights_only=True`` into the dense class)."""
    for module in model.modules():
        for key, hook in list(module._forward_pre_hooks.items()):
            if isinstance(hook, tprune.BasePruningMethod):
                tprune.remove(module, hook._tensor_name)
            elif isinstance(hook, ApplyChildMasks):
                del module._forward_pre_hooks[key]
        if isinstance(module, nn.RNNBase):
            module.flatten_parameters()
    return model


def layer_sparsity(model: nn.Module, layers: tuple[str, ...] = ()) -> dict[str, float]:
    """Fraction of exact zeros in each prunable weight's *effective* value (mask applied)."""
    out = {}
    for n, m, w in prunable_weights(model, layers):
        mask = _mask(m, w)
        t = getattr(m, w + "_orig") * mask if mask is not None else getattr(m, w)
        out[f"{n}.{w}" if n else w] = float((t == 0).sum()) / t.numel()
    return out


def _positions(module: nn.Module, args: tuple, out: Any) -> int:
    # MACs of a weight = (number of output positions it is applied at) x (its number of entries).
    if isinstance(module, nn.RNNBase):
        x = args[0]
        return int(x.shape[0] * x.shape[1]) if x.dim() == 3 else int(x.shape[0])
    if isinstance(module, (nn.Conv1d, nn.Conv2d)):
        return out.numel() // out.shape[1]
    if isinstance(module, nn.Linear) or is_conv1d(module):
        return out.numel() // out.shape[-1]
    return 0  # embeddings: lookups, no multiply-accumulates


@torch.no_grad()
def layer_report(model: nn.Module, example_inputs: tuple, layers: tuple[str, ...] = ()) -> dict[str, dict]:
    """Per prunable weight: shape, entries, non-zeros, sparsity, dense MACs and MACs if zeros were skipped
    (for one forward of ``example_inputs``). Runs one eval-mode forward."""
    targets = prunable_weights(model, layers, example_inputs)
    pos: dict[int, int] = {}

    def attention(mod: nn.Module, args: tuple, kwargs: dict, out: Any) -> None:
        q = args[0] if args else kwargs["query"]  # in_proj and out_proj both run at every query position
        pos[id(mod)] = pos[id(mod.out_proj)] = q.numel() // q.shape[-1]

    handles = [m.register_forward_hook(lambda mod, a, o: pos.__setitem__(id(mod), _positions(mod, a, o)))
               for _, m, _ in targets if not isinstance(m, nn.MultiheadAttention)]
    handles += [m.register_forward_hook(attention, with_kwargs=True) for m in model.modules()
                if isinstance(m, nn.MultiheadAttention)]
    was = model.training
    model.eval()
    try:
        model(*example_inputs)
    finally:
        model.train(was)
        for h in handles:
            h.remove()
    rep = {}
    for n, m, w in targets:
        mask = _mask(m, w)
        t = getattr(m, w + "_orig") * mask if mask is not None else getattr(m, w)
        nnz = int(torch.count_nonzero(t))
        p = pos.get(id(m), 0)
        rep[f"{n}.{w}" if n else w] = {"shape": list(t.shape), "params": t.numel(), "nonzero": nnz,
                           "sparsity": 1 - nnz / t.numel(), "macs": p * t.numel(), "macs_if_skipped": p * nnz}
    return rep


def sparse_size_bytes(model: nn.Module) -> int:
    """Bytes of ``torch.save(state_dict)`` with every weight that is smaller in CSR (int32 indices, matrix
    view [out, rest]) stored as CSR: what the zeros buy on disk, as opposed to the dense checkpoint. Break-even
    is ~50 % sparsity for fp32, since each kept value also stores a 4-byte column index."""
    sd = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "sparse CSR support is in beta"
        for k, t in model.state_dict().items():
            if t.is_floating_point() and t.dim() >= 2:
                nnz = int(torch.count_nonzero(t))
                if nnz * (t.element_size() + 4) + (t.shape[0] + 1) * 4 < t.numel() * t.element_size():
                    csr = t.reshape(t.shape[0], -1).to_sparse_csr()  # int32 indices: 4 bytes per entry
                    t = torch.sparse_csr_tensor(csr.crow_indices().int(), csr.col_indices().int(), csr.values(),
                                                csr.shape)
            sd[k] = t
    buf = io.BytesIO()
    torch.save(sd, buf)
    return buf.getbuffer().nbytes


def sensitivity_scan(model: nn.Module, evaluate: Callable[[nn.Module], float], amounts: tuple[float, ...],
                     layers: tuple[str, ...] = (), method: str = "l1_unstructured") -> list[dict[str, Any]]:
    """Metric after pruning ONE layer at a time to each amount (no fine-tuning), on copies of ``model``:
    the layers whose metric falls first deserve a smaller share of the sparsity budget."""
    rows = []
    for n, _, w in prunable_weights(model, layers):
        for a in amounts:
            trial = copy.deepcopy(model)
            mod = trial.get_submodule(n)
            set_sparsity(trial, PruneConfig(method=method, amount=a if a > 0 else 0.5), a, [(n, mod, w)])
            rows.append({"layer": f"{n}.{w}", "amount": a, "metric": evaluate(trial)})
    return rows

__all__ = [
    "ApplyChildMasks", "attach_mask_refresh", "DEFAULT_TYPES", "excluded_weights", "layer_report", "layer_sparsity",
    "make_permanent", "MASKABLE_TYPES", "prunable_weights", "prune", "sensitivity_scan", "set_sparsity", "SHORTFALL",
    "sparse_size_bytes", "Target", "UNSTRUCTURED",
]
