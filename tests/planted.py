"""Planted ablations for the tests that read one back (the recommendation card, its CLI and its dashboard card):
a real ablation of a small workload whose timings are planted after each real run, so what the card must say is
known whatever load the suite's machine carries."""

from __future__ import annotations

from lab import RunConfig
from lab.ablation import Ablation, run_ablation
from lab.recipes import from_techniques
from lab.store import ResultStore
from lab.train import run


def planted_ablation(store: ResultStore, workload: str, *, busy: bool = False, size: str = "tiny", name: str = "card",
                     repeats: int = 3, fused: float = 0.5) -> Ablation:
    """Baseline, A/A and ``fused_optim`` on ``workload`` (``repeats`` repeats, 4 steps each, stored in ``store`` as the
    ablation ``name``; ``"doctor"`` is what a Doctor verification is called): every run is real, then its step and
    training times are replaced with fused_optim's at ``fused`` times the baseline's (1 % jitter), on a quiet
    machine unless ``busy``."""
    counter = iter(range(10_000))

    def planted(cfg: RunConfig, **kw: object):  # noqa: ANN202 - a RunResult
        res = run(cfg, **kw)
        k = fused if cfg.compute.fused_optimizer else 1.0
        jitter = 1.0 + 0.01 * (next(counter) % 3)
        res.train_time_s = 2.0 * k * jitter
        res.step_times_ms = {"total": [10.0 * k * jitter] * max(len(res.step_times_ms.get("total", [])), 8)}
        res.details["contention"] = {"busy": busy, "others_cores": 1.8 if busy else 0.0,
                                     **({"sentence": "measured while busy (planted)"} if busy else {})}
        return res

    ab = from_techniques(name, RunConfig(workload=workload, size=size, threads=1, max_steps=4), [["fused_optim"]])
    run_ablation(ab, repeats=repeats, store=store, run_fn=planted)
    return ab
