"""Where does it pay, with threads? The crossover map at 1 thread against all cores, and loader workers
against compute threads along the vision ladder (issue 15, item 5).

    python benchmarks/crossover_threads.py [--quick] [--json PATH]

Part 1: the map (:func:`lab.crossover.build_map`, the crossover's quick settings) built at 1 thread and at
all usable cores, alternating per workload, compared by :func:`lab.crossover.compare_maps`: the fp32
baseline's own thread scaling per rung (base ms at 1 thread / at N: how much the other cores buy the step;
near 1x where dispatch-bound) and every technique's speedup and verdict at both thread counts, with the
verdicts that flip. Part 2 (:func:`lab.crossover.workers_along_ladder`): file-backed vision (PNG in
WebDataset shards on the emulated ``network_fs``, Pillow decode per sample), per rung "all cores compute +
thread prefetcher" against "cores-1 compute threads + 1 DataLoader worker", interleaved ``lab.run``s, the
throughput ratio with its bootstrap 95 % CI, and the smallest rung from which the worker stops paying, with
the lab rule's pick per rung (goal: it picks the measured winner on >= 75 % of the rungs the CI separates).
``--quick``: the Transformer at rungs xs and l (650x apart) with bf16, dynamic int8 and fused Adam, 3 rounds;
vision ladder xs, m, l, 3 rounds of 6 steps. Full: sequence, vision and Transformer at xs, m, l, + channel
pruning; ladder xs, s, m, l, 4 rounds of 10 steps (xl is left out: one 2-thread step of its 11 M-parameter
ResNet costs seconds here). The 2-thread half costs several times the 1-thread half on a shared box.
On a shared 2-core box other load swings multi-threaded timings by several times: read the CIs.
"""

from __future__ import annotations

import sys

from _common import parse_args

from lab import crossover


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    study = crossover.threads_study(quick=args.quick, progress=lambda m: print(m, file=sys.stderr, flush=True))
    print("\n".join(crossover.summary_lines(study)))
    for f in study["figures"]:
        if f["goal"]:
            print(f"{f['name']:<60} {f['value'] if f['value'] is not None else '—'} {f['unit']}  goal {f['goal']}: "
                  f"{'met' if f['met'] else 'NOT met'}")
    if args.json:
        print(f"wrote {crossover.write_study(study, args.json)}")


if __name__ == "__main__":
    main()
