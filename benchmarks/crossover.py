"""Where does it pay? Every technique's speedup against model size, on this machine (issue 15).

    python benchmarks/crossover.py [--quick] [--json PATH]

For ctr, sequence, vision, transformer and mlp (the dense reference), every rung of the model-size ladder
(xs .. xl, >= 100x parameters up to >= 5 M) and every technique (bf16, fp16, auto, dynamic / static int8 in the
legacy flow, static int8 through PT2E and ``--quant-flow auto``'s pick between the two, channel pruning 50 %,
torch.compile, fused Adam, one DataLoader worker): the speedup of one training step
(forward + loss + backward + Adam on a fixed batch) and of one inference call, arms interleaved,
threads=1, bootstrap 95 % CI; then ``time = overhead + cost x MACs`` fitted per workload x technique x
axis, the crossover measured (smallest rung whose CI lower bound is above 1) and predicted (where the fitted
lines cross), a regime tag per rung and the leave-one-out error (:mod:`lab.crossover`); then the lab's arms
beside plain PyTorch (nothing from ``lab``) on the mlp ladder's largest rung (:mod:`lab.crossover.reference`,
``reference`` in the JSON). Same as ``python -m lab crossover``. Rounds per rung x axis stop after 3 once
20 s (quick: 8 s) of timing have passed. Figures include each ``auto``'s share of its best candidate at the top
rung (goal >= 90 %).
``--quick``: 4 rungs per workload (still >= 100x parameters), the techniques that are cheap to build (no
compile, no static int8 calibration, no worker processes), 4 rounds; batches: :func:`lab.crossover.mapping.map_batch`.
The JSON is the map (``env``, ``rows``, ``crossovers``, ``fits``, ``reference``) inside the benchmark
envelope (``benchmark``, ``quick``, ``figures``). Goals: see :mod:`lab.crossover.report`.
"""

from __future__ import annotations

import sys

from _common import parse_args

from lab import crossover
from lab.measure import machine_card

WORKLOADS = list(crossover.MAP_WORKLOADS)


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    techniques = list(crossover.QUICK_TECHNIQUES if args.quick else crossover.TECHNIQUES)
    # The machine card (cached after the first time): the map's bf16 / fp16 / int8 rows cite its GEMM peaks.
    machine_card(quick=args.quick, progress=lambda m: print(m, file=sys.stderr, flush=True))
    the_map = crossover.build_map(WORKLOADS, techniques, quick=args.quick, threads=1,
                                  progress=lambda m: print(m, file=sys.stderr, flush=True))
    the_map["figures"] = crossover.figures(the_map)
    print("\n".join(crossover.headline_lines(the_map)))
    for f in the_map["figures"]:
        if f["goal"]:
            print(f"{f['name']:<60} {f['value']:.3g} {f['unit']}  goal {f['goal']}: {'met' if f['met'] else 'NOT met'}")
    print(f"wall time {the_map['wall_s']:.0f} s")
    if args.json:
        print(f"wrote {crossover.write_map(the_map, args.json)}")


if __name__ == "__main__":
    main()
