"""The recipe: a technique stack handed back as one plain-PyTorch file with no ``lab`` import
(``python -m lab recipe``), so a verdict ends in code the user takes away.

Why the families write it: each family owns what its options mean (``lab/<family>/``), so each writes its own part
(:meth:`lab.technique.Technique.portable` -> :class:`lab.technique.Portable`: lines at the fixed places of one
training script) from the *config*, as a run reads it; this module only stitches the parts in
:data:`lab.registry.FAMILY_ORDER`, the order a run applies them. Why from a config and not from option names: an
ablation arm, a stored run and the doctor's prescription are configs (an arm may change a field no option names,
such as the top stack's fine-tune epochs, or ``ddp.world_size``), and an option is a named set of overrides.
A config the script cannot express is refused with the family's reason (:class:`lab.technique.NotPortable`),
never written as something else; a decision the lab makes by measuring (``amp_auto``, ``int8_auto``) is written as
what a stored run of it chose (``run``), else as what the lab keeps without a measurement, and the header says so.

The script: ``fit(model, loader, loss_fn, ...)`` (the step: autocast around forward + loss, backward, optimizer
step), ``train(model, loss_fn, train_set, ...)`` (the loader, the main fit, then what comes after training:
pruning + fine-tune, QAT), ``for_inference(model, calibration_set)`` when the stack has int8, and a ``__main__``
block with a placeholder model and data so the file runs as it is. Its header says what the lab measured for the
stack when a stored run is given (and on which hardware id) and what each part leaves to the lab. CI runs every
option's file against the lab's own run (``tests/core/test_portable.py``).
"""

from __future__ import annotations

import ast
import itertools
import re
import sys
import textwrap
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from lab.config import FAMILIES as CONFIG_FAMILIES
from lab.config import RunConfig, load_workload
from lab.context import resolve
from lab.measure import environment_stamp
from lab.recipes import combine
from lab.registry import FAMILY_ORDER, OPTIONS
from lab.result import RunResult
from lab.technique import Portable, TechniqueChain, default_chain

#: The places that take one expression: two families of a stack filling one of them cannot be stitched.
SINGLE = ("autocast", "backward", "step", "loader_class", "optimizer", "placeholder")
OPTIMIZERS = {"adam": "torch.optim.Adam({params}, lr=lr{kw})",
              "sgd": "torch.optim.SGD({params}, lr=lr, momentum=0.9{kw})"}  # lab.loop.make_optimizer
#: Config fields the script takes as ``train``'s parameters (their config value is the default), not in its title.
SIGNATURE = ("data.shuffle=",)
BASE_IMPORTS = ("import torch", "from torch import nn", "from torch.utils.data import DataLoader, TensorDataset")


@dataclass(frozen=True)
class Recipe:
    """The script (``text``) and what it was made of."""

    text: str
    cfg: RunConfig
    title: str
    parts: dict[str, Portable]  # family -> its part, in FAMILY_ORDER
    requires: tuple[str, ...]  # pip packages beyond torch
    launch: str  # how to start it (``{file}``: the file's name)

    def how_to_run(self, file: str = "recipe.py") -> str:
        return self.launch.format(file=file)


def config_of(techniques: Sequence[str], base: RunConfig | None = None) -> RunConfig:
    """``base`` (default: ``RunConfig()``) with the stack's overrides; conflicting options are refused as
    :func:`lab.recipes.combine` refuses them, an unknown name lists the known ones."""
    return (base or RunConfig()).with_overrides(**combine(techniques))


def changed_fields(cfg: RunConfig) -> list[str]:
    """``family.field=value`` for every family field ``cfg`` sets away from its default."""
    now, default = cfg.to_dict(), RunConfig().to_dict()
    return [f"{fam}.{k}={v!r}" for fam in CONFIG_FAMILIES for k, v in now.get(fam, {}).items()
            if (default.get(fam) or {}).get(k) != v]  # a family that is off may be left out of to_dict()


def options_of(cfg: RunConfig) -> tuple[list[str], list[str]]:
    """``(options, fields)``: ``cfg``'s stack named as a user would, in the order a run applies the families: per
    family the fewest options (and ``family.field=value`` where ``cfg`` differs from them) that make its config
    exactly (``prune_channels50`` + ``prune.finetune_epochs=3``; a family no option names: its fields)."""
    names: list[str] = []
    fields: list[str] = []
    for fam in _config_order():
        if cfg.to_dict().get(fam) == RunConfig().to_dict().get(fam):  # an off family may be left out
            continue
        mine = [n for n, o in OPTIONS.items() if {k.split(".")[0] for k in o.overrides if "." in k} == {fam}]
        best = min(((list(c), d) for k in range(4) for c in itertools.combinations(mine, k)
                    if (d := _unexplained(c, cfg, fam)) is not None), key=lambda cd: (len(cd[0]) + len(cd[1]),
                                                                                       len(cd[1])))
        names += best[0]
        fields += best[1]
    return names, fields


def _config_order() -> list[str]:
    """The config families in the order of :data:`lab.registry.FAMILY_ORDER` (a family's config key read off its
    options' overrides; a family without options, data-parallel, where it stands or last)."""
    keys = {o.family: k.split(".")[0] for o in OPTIONS.values() for k in o.overrides if "." in k}
    order = [keys.get(f, f) for f in FAMILY_ORDER]
    return [k for k in order if k in CONFIG_FAMILIES] + [k for k in CONFIG_FAMILIES if k not in order]


def _unexplained(options: Sequence[str], cfg: RunConfig, fam: str) -> list[str] | None:
    """The ``fam`` fields ``cfg`` sets otherwise than ``options`` do (``None``: they conflict, or one of them sets a
    top-level field such as the device otherwise than ``cfg``)."""
    try:
        merged = combine(options)
        made = RunConfig().with_overrides(**merged)
    except ValueError:
        return None
    if any(getattr(cfg, k) != v for k, v in merged.items() if "." not in k):
        return None
    theirs, mine = made.to_dict().get(fam, {}), cfg.to_dict().get(fam, {})
    return [f"{fam}.{k}={v!r}" for k, v in mine.items()
            if theirs.get(k) != v and not f"{fam}.{k}=".startswith(SIGNATURE)]


def measured_lines(run: RunResult) -> list[str]:
    """What a stored run measured, as the header's lines (one run: no ratio; an ablation gives those)."""
    s = run.summary()
    cfg = run.config or {}

    def num(v: float | None, unit: str = "") -> str:
        return "n/a" if v is None else f"{v:.4g}{unit}"

    lines = [f"run {run.run_id[:8]} ({s['workload']} {cfg.get('size')}, seed {cfg.get('seed')}, "
             f"{(run.started_at or '')[:16]}) on {run.hardware_id}, torch {run.env.get('torch_version', '?')}: "
             f"{run.status}",
             f"  training: {run.steps} steps in {num(run.train_time_s, ' s')}, median step "
             f"{num(s['median_step_ms'], ' ms')}, {run.metric_name} {num(run.metric_before)} -> {num(run.metric)}"]
    latency = "; ".join(f"{k.replace('_', ' ')} {num(run.latency_median_ms(k), ' ms')}" for k in run.latency_ms)
    if latency:
        lines.append(f"  inference latency: {latency}; model {num((run.model_bytes or 0) / 1e6, ' MB')}")
    lines += [f"  why: {w}" for w in run.why[:4]]
    return lines


def build(cfg: RunConfig, *, techniques: Sequence[str] = (), run: RunResult | None = None,
          measured: Sequence[str] = (), command: str = "", chain: TechniqueChain | None = None) -> Recipe:
    """The plain-PyTorch script of ``cfg``: every family's part (:meth:`~lab.technique.Technique.portable`)
    stitched in the chain's order. ``techniques`` names the stack in the title; ``run`` is a stored run of ``cfg``
    (its decisions and, unless ``measured`` says otherwise, its figures in the header); ``command`` is what wrote
    it. Raises ``ValueError`` (:class:`~lab.technique.NotPortable` among them) for what cannot run here or cannot
    be written out."""
    chain = default_chain() if chain is None else chain
    cfg = load_workload(cfg)  # a stored run's workload spec, imported to write its script
    chain.check(cfg)  # what the lab would refuse to run is not handed out as "what the lab measured"
    parts = {t.name: p for t in chain if (p := t.portable(cfg, run)) is not None}
    for place in SINGLE:
        owners = [f for f, p in parts.items() if getattr(p, place)]
        if len(owners) > 1:
            raise ValueError(f"{' and '.join(owners)} both set the script's {place}: they cannot be stitched")
    if sum(bool(p.inference) for p in parts.values()) > 1:
        raise ValueError("two families write for_inference: they cannot be stitched")
    if techniques:
        named = set(changed_fields(config_of(techniques)))
        stack = [*techniques, *(f for f in changed_fields(cfg) if f not in named and not f.startswith(SIGNATURE))]
    else:
        stack = [part for group in options_of(cfg) for part in group]
    title = " + ".join(stack) or "the plain fp32 loop"
    measured = list(measured) or (measured_lines(run) if run is not None else [])
    launch = next((p.launch for p in parts.values() if p.launch), "python {file}")
    requires = tuple(sorted({r for p in parts.values() for r in p.requires}))
    code = "\n".join([*_fit(cfg, parts), "", "", *_train(cfg, title, parts), "", "", *_inference(cfg, parts),
                      *_helpers(parts), *_main(cfg, parts)])
    header = _header(cfg, title, parts, measured, command, launch, requires)
    text = "\n".join([*header, "", *_imports(parts, code), "", "", code]) + "\n"
    return Recipe(text=text, cfg=cfg, title=title, parts=parts, requires=requires, launch=launch)


def from_techniques(techniques: Sequence[str], base: RunConfig | None = None, **kwargs: object) -> Recipe:
    """:func:`build` of ``base`` with the stack ``techniques`` (option names) applied."""
    return build(config_of(techniques, base), techniques=tuple(techniques), **kwargs)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------- the script


def _header(cfg: RunConfig, title: str, parts: dict[str, Portable], measured: list[str], command: str,
            launch: str, requires: tuple[str, ...]) -> list[str]:
    env = environment_stamp(cfg.device)
    epochs, batch, lr, _ = _defaults(cfg)
    sha = str(env.get("git_sha") or "unknown")[:10]
    lines = [f'"""Training with {title}: plain PyTorch, no lab import. Copy it into your project.', "",
             f"Written by `{command or 'lab.portable.build'}` (training-efficiency lab {sha}) on "
             f"{env['hardware_id']}, torch {env['torch_version']}. Its defaults (epochs {epochs}, batch {batch}, lr "
             f"{lr:g}) are the lab's for {cfg.workload} at size {cfg.size}.", ""]
    lines += ["What the lab measured for it:"] + ([f"  {m}" for m in measured] if measured else
                                                 ["  nothing given: `python -m lab recipe --run RUN_ID` puts a stored "
                                                  "run's figures here"])
    lines += ["", "The stack, in the order a lab run applies it:"]
    lines += [f"  {family:<12}{p.comment}" for family, p in parts.items()] or ["  nothing: the plain fp32 loop"]
    notes = [n for p in parts.values() for n in p.notes]
    if notes:
        lines += ["", "Notes:"] + [f"  - {n}" for n in notes]
    lines += ["", f"Run it:  {launch.format(file=_file_name(title))}   (a placeholder model and data; train() takes "
                  "yours)"]
    if requires:
        lines.append(f"Needs:   pip install {' '.join(requires)}")
    return [*_wrap(lines), '"""']


def _file_name(title: str) -> str:
    return (re.sub(r"[^a-z0-9]+", "_", title.lower()).strip("_")[:60] or "recipe") + ".py"


def _wrap(lines: list[str], width: int = 116) -> list[str]:
    """Long header lines folded at ``width``, a continuation under its line's text (past a "- " or a family name)."""
    out = []
    for line in lines:
        lead = len(line) - len(line.lstrip())
        m = re.match(r" *(- |\w+ {2,})", line)
        sub = " " * (lead + (len(m.group(1)) if m else 2 if lead else 0))
        out += textwrap.wrap(line, width, subsequent_indent=sub, break_long_words=False, break_on_hyphens=False,
                             drop_whitespace=True) or [""]
    return out


def _bound(name: str) -> str:
    """The name an import binds (``x as y`` -> y; ``import a.b`` -> a)."""
    return name.split(" as ")[-1].strip().split(".")[0]


def _imports(parts: dict[str, Portable], code: str) -> list[str]:
    """The base imports and every part's that ``code`` uses, each module once (``from x import`` lines merged),
    standard library first, as isort orders them."""
    used = {n.id for n in ast.walk(ast.parse(code)) if isinstance(n, ast.Name)}
    plain: set[str] = set()
    names: dict[str, set[str]] = {}
    for line in (*BASE_IMPORTS, *(i for p in parts.values() for i in p.imports)):
        m = re.match(r"from (\S+) import (.+)", line)
        if m:
            kept = {n.strip() for n in m.group(2).split(",") if _bound(n) in used}
            if kept:
                names.setdefault(m.group(1), set()).update(kept)
        elif _bound(line.split(None, 1)[1]) in used:
            plain.add(line)
    def by_type(name: str) -> tuple[int, str]:  # isort's order: CONSTANTS, Classes, functions
        return (0 if name.isupper() and len(name) > 1 else 1 if name[0].isupper() else 2, name)

    lines = plain | {f"from {mod} import {', '.join(sorted(ns, key=by_type))}" for mod, ns in names.items()}

    def group(line: str) -> tuple[int, int, str]:
        module = line.split()[1]
        return (0 if module.split(".")[0] in sys.stdlib_module_names else 1, line.startswith("from"), module)

    ordered = sorted(lines, key=group)
    out: list[str] = []
    for i, line in enumerate(ordered):
        if i and group(line)[0] != group(ordered[i - 1])[0]:
            out.append("")
        out.append(line)
    return out


def _kwargs(pairs: Iterable[tuple[str, str]]) -> str:
    return "".join(f", {k}={v}" for k, v in pairs)


def _call(head: str, args: list[str], width: int = 116) -> list[str]:
    """``head`` + the arguments + ``)``, folded after a comma where the line would pass ``width``."""
    lines, line = [], head
    for i, arg in enumerate(args):
        piece = arg + (", " if i < len(args) - 1 else ")")
        if len(line) + len(piece.rstrip()) > width and line.strip() != head.strip():
            lines.append(line.rstrip())
            line = " " * len(head)
        line += piece
    return [*lines, line]


def _indent(lines: Iterable[str], n: int) -> list[str]:
    return [" " * n + line if line else "" for line in lines]


def _fit(cfg: RunConfig, parts: dict[str, Portable]) -> list[str]:
    ps = list(parts.values())
    optimizer = next((p.optimizer for p in ps if p.optimizer), OPTIMIZERS[cfg.optimizer]).format(
        params="[p for p in model.parameters() if p.requires_grad]",
        kw=_kwargs(kv for p in ps for kv in p.optimizer_kwargs))
    autocast = next((p.autocast for p in ps if p.autocast), None)
    backward = next((p.backward for p in ps if p.backward), "loss.backward()")
    step = [line for p in ps for line in p.step] or ["optimizer.step()"]
    forward = ["loss = loss_fn(forward(*inputs), target)"]
    if autocast:
        forward = [f"with {autocast}:  # forward + loss only",
                   *_indent(forward, 4)]
    return ['def fit(model, loader, loss_fn, *, epochs, lr, device, phase="train"):',
            '    """One training phase (the main training, or a fine-tune after pruning / QAT): the loss of every '
            'step."""',
            f"    optimizer = {optimizer}",
            "    forward = model",
            *_indent((line for p in ps for line in p.fit_setup), 4),
            "    losses = []",
            "    model.train()",
            f"    for {'epoch' if any(p.epoch_start for p in ps) else '_'} in range(epochs):",
            *_indent((line for p in ps for line in p.epoch_start), 8),
            "        for batch in loader:",
            "            *inputs, target = (t.to(device, non_blocking=True) for t in batch)",
            *_indent(forward, 12),
            f"            {backward}",
            *_indent(step, 12),
            "            optimizer.zero_grad(set_to_none=True)",
            "            losses.append(loss.detach())  # no .item() per step: a host sync that stalls a GPU's queue",
            "    return torch.stack(losses).float().tolist() if losses else []"]


def _defaults(cfg: RunConfig) -> tuple[int, int, float, str]:
    r = resolve(cfg)
    return r.epochs, r.batch_size, r.lr, "None" if cfg.device == "auto" else f'"{cfg.device}"'


def _train(cfg: RunConfig, title: str, parts: dict[str, Portable]) -> list[str]:
    ps = list(parts.values())
    epochs, batch, lr, device = _defaults(cfg)
    loader_class = next((p.loader_class for p in ps if p.loader_class), "DataLoader")
    kwargs = {"shuffle": "shuffle", "drop_last": "True"}
    for p in ps:
        kwargs.update(dict(p.loader_kwargs))
    return [f"def train(model, loss_fn, train_set, *, epochs={epochs}, batch_size={batch}, lr={lr!r}, seed={cfg.seed}, "
            f"shuffle={cfg.data.shuffle},", f"          device={device}):",
            *_docstring(f"Train `model` on `train_set` (a Dataset of (inputs..., target) tuples) with {title}; "
                        "returns the trained model and the loss of every training step. `device`: None is cuda when "
                        "present, else cpu."),
            "    torch.manual_seed(seed)  # the batch order and any dropout draw from it",
            "    device = torch.device(device or (\"cuda\" if torch.cuda.is_available() else \"cpu\"))",
            *_indent((line for p in ps for line in p.setup), 4),
            "    model = model.to(device)",
            *_call(f"    loader = {loader_class}(", ["train_set", "batch_size=batch_size",
                                                       *(f"{k}={v}" for k, v in kwargs.items())]),
            *_indent((line for p in ps for line in p.wrap), 4),
            "    losses = fit(model, loader, loss_fn, epochs=epochs, lr=lr, device=device)",
            *_indent((line for p in ps for line in p.unwrap), 4),
            *_indent((line for p in ps for line in p.after_training), 4),
            "    return model, losses"]


def _docstring(text: str, indent: int = 4, width: int = 116) -> list[str]:
    lines = textwrap.wrap(f'"""{text}"""', width - indent, break_long_words=False, break_on_hyphens=False)
    return _indent(lines, indent)


def _inference(cfg: RunConfig, parts: dict[str, Portable]) -> list[str]:
    body = next((p.inference for p in parts.values() if p.inference), ())
    if not body:
        return []
    batch = _defaults(cfg)[1]
    return [f"def for_inference(model, calibration_set, *, batch_size={batch}):",
            '    """The int8 model of the trained `model`, for CPU inference. `calibration_set`: training data, '
            '(inputs...,',
            '    target) tuples (the target is not used)."""', *_indent(body, 4), "", ""]


def _helpers(parts: dict[str, Portable]) -> list[str]:
    out: list[str] = []
    for block in dict.fromkeys(b for p in parts.values() for b in p.helpers):  # each once, in order
        out += [*block.splitlines(), "", ""]
    return out


def _main(cfg: RunConfig, parts: dict[str, Portable]) -> list[str]:
    batch = _defaults(cfg)[1]
    lines = ['if __name__ == "__main__":',
             "    # A placeholder model and data so that the file runs as it is: replace them with yours.",
             "    torch.manual_seed(0)",
             f"    features = torch.randn({8 * batch}, 32)",
             "    data = TensorDataset(features, features[:, :10].argmax(1))  # 10 classes",
             "    model = " + next((p.placeholder for p in parts.values() if p.placeholder),
                              "nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), "
                              "nn.Linear(64, 10))"),
             "    model, losses = train(model, nn.functional.cross_entropy, data, epochs=1)",
             "    print(f\"trained {len(losses)} steps: loss {losses[0]:.3f} -> {losses[-1]:.3f}\")"]
    if any(p.inference for p in parts.values()):
        ranked = any(p.launch for p in parts.values())
        use = ["int8 = for_inference(model, data)",
               "with torch.no_grad():",
               "    print(\"int8 model:\", tuple(int8(features[:8]).shape), \"outputs for 8 rows\")"]
        lines += _indent(["if int(os.environ.get(\"RANK\", \"0\")) == 0:  # rank 0 holds the final model",
                          *_indent(use, 4)] if ranked else use, 4)
    return lines


__all__ = ["Recipe", "build", "changed_fields", "config_of", "from_techniques", "measured_lines", "options_of"]

