"""Data-parallel training as the doctor's advice: what W ranks would buy, and the share of the step comm takes.

Why advice and not a ranked prescription: DDP ranks keep the per-rank batch, so the effective batch grows W
times and an epoch takes 1/W of the steps; it competes on samples per second, while the verification measures
per-step time against the baseline. Two sources: a profiled DDP step (:mod:`lab.measure.profile` counts its
exposed all-reduce as ``comm``), or one process's step plus the all-reduce of its gradients over this
machine's calibrated link (:mod:`lab.distributed.scaling`). Pure: tests feed synthetic breakdowns.
"""

from __future__ import annotations

from lab.distributed.scaling import Link, project
from lab.doctor.predict import Prediction, _fmt, _pct
from lab.measure.profile import Breakdown


def predict_data_parallel(b: Breakdown, world_size: int, *, measured: bool = False, grad_bytes: float = 0.0,
                          link: Link | None = None, bucket_bytes: float = 25 * 2**20,
                          core_share: float = 1.0) -> Prediction | None:
    """Data-parallel training on ``world_size`` ranks at the baseline's per-rank batch, as samples per second
    against one process (axis ``train``: an epoch takes 1/W of the steps; the effective batch grows W times,
    so it is advice, not an arm the verification runs against the per-step baseline).

    ``measured``: ``b`` is a profiled DDP step, whose ``comm`` class is the exposed all-reduce time; one
    process would take the rest, so the speedup is ``W (1 - comm share)``, between losing DDP's overlap (the
    whole in-flight time exposed) and a perfect one (W). Otherwise ``b`` is one process's step and the
    all-reduce comes from this machine's calibrated ``link`` (:func:`lab.distributed.scaling.project`, compute
    share / W + comm, with the comm hidden behind none / half / all of backward); ranks that share cores
    (``core_share`` > 1: ranks x threads over the cores) slow compute by that factor."""
    step, w = b.step_ms, world_size
    if step <= 0 or w < 2:
        return None
    if measured:
        comm, flight = b.ms.get("comm", 0.0), max(b.comm_inflight_ms, b.ms.get("comm", 0.0))
        s = w * (step - comm) / step
        lo = w * max(step - comm, 1e-9) / (step - comm + flight)
        why = (f"communication {_pct(comm / step)} of the step (the exposed all-reduce; {flight:.2f} ms per step in "
               f"flight, the rest overlapped with backward) -> the {w} ranks process samples "
               f"{_fmt(s, min(lo, s), float(w))} as fast as one process (compute share / world size + comm); no "
               "technique here shrinks comm: fewer, larger all-reduces (--ddp-bucket-cap-mb, --grad-accum-steps) "
               "or a faster link do")
        return Prediction(f"ddp{w}", "train", s, min(lo, s), float(w), why, ["measured here: profiled DDP step"])
    if link is None or grad_bytes <= 0:
        return None
    compute_s = step / 1e3 * max(core_share, 1.0)
    rows = [project(compute_s, grad_bytes, [w], link, bucket_bytes=bucket_bytes, overlap=o)[0] for o in (0.0, 0.5, 1.0)]
    lo, s, hi = (r["speedup"] * step / 1e3 / compute_s for r in rows)
    comm_ms = rows[0]["comm_ms"]
    slow = f"; {w} ranks share the cores ({core_share:.1f}x slower compute)" if core_share > 1 else ""
    why = (f"an all-reduce of {grad_bytes / 1e6:.2f} MB of gradients on {w} ranks takes {comm_ms:.2f} ms here "
           f"({link.name}), {_pct(comm_ms / (comm_ms + step))} of a {w}-rank step if none of it hides behind "
           f"backward{slow} -> {w} ranks predicted {_fmt(s, lo, hi)} the samples per second of one process "
           f"(compute share / world size + comm; verify with --ddp-world-size {w})")
    return Prediction(f"ddp{w}", "train", s, lo, hi, why, [f"calibrated link: {link.name}"])


__all__ = ["predict_data_parallel"]
