"""The zoo's pattern x technique table (issue 45): every pattern of tests/zoo_models.py through one option of every
technique family, the slow doors included (``torch.compile``, the three PT2E int8 flows, low-bit Adam, DDP x 2),
each cell ok (with the effect the record shows), a fallback said in ``why``, a one-line refusal before the work,
or a failed run's one line. ``tests/e2e/test_zoo.py`` holds the cheap columns to this in CI; this script writes
the whole table for docs/workloads.md (it takes several minutes: PT2E and compile run Inductor per cell).

Run it: ``python tests/zoo_table.py [--only compile,int8_dynamic] [--patterns tied,fused_qkv] [--json PATH]``
(a cell already in ``--json`` is not run again); ``--markdown`` prints the table of those cells.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

#: column -> overrides; the CI test's columns first.
COLUMNS: dict[str, dict] = {
    "prefetch+fused_optim": {"data.loader": "thread", "compute.fused_optimizer": True},
    "compile": {"compute.compile": True},
    "bf16": {"precision.dtype": "bf16"},
    "checkpoint_blocks": {"memory.checkpoint": "blocks"},
    "adam8bit": {"memory.optimizer_state": "int8"},
    "prune50": {"prune.method": "l1_unstructured", "prune.amount": 0.5, "prune.finetune_epochs": 1},
    "prune_channels50": {"prune.method": "structured_channels", "prune.amount": 0.5, "prune.finetune_epochs": 1},
    "int8_dynamic": {"quant.method": "dynamic"},
    "int8_static": {"quant.method": "static", "quant.calibration_batches": 2},
    "int8_qat": {"quant.method": "qat"},
    "int8_eager": {"quant.method": "dynamic", "quant.flow": "legacy"},
    "int8_static_legacy": {"quant.method": "static", "quant.flow": "legacy", "quant.calibration_batches": 2},
    "int8_qat_legacy": {"quant.method": "qat", "quant.flow": "legacy"},
    "ddp2": {"ddp.world_size": 2, "ddp.timeout_s": 120, "batch_size": 16},
}


def effect(r, column: str) -> str:
    """What the record shows the technique did, in a few words."""
    d = r.details
    if column == "prefetch+fused_optim":
        s = d["steps"]["train"]
        return f"{s['loader']}, fused={s['fused']}"
    if column == "compile":
        return "compiled" if d["steps"]["train"]["compiled"] else "NOT compiled"
    if column == "bf16":
        layers = d["precision"]["phases"]["train"]["layer_dtypes"]
        n = sum(rec["output_dtype"] == "bfloat16" for rec in layers)
        return f"{n}/{len(layers)} modules bf16"
    if column == "checkpoint_blocks":
        return f"{len(d['memory']['checkpointed_blocks'])} block(s) recomputed"
    if column == "adam8bit":
        return f"state {d['memory']['optimizer_state']}"
    if column == "prune50":
        return f"sparsity {d['pruning']['sparsity_prunable']:.2f}"
    if column == "prune_channels50":
        shrunk = sum(after < before for before, after in d["pruning"]["channels"].values())
        return f"{shrunk} layer(s) narrower, params {r.param_count}/{d['pruning']['params_dense']}"
    if column.startswith("int8"):
        q = d["quant"]
        graph = q["swap"].get("graph", {})
        ops = f"{graph['int8_linear']} int8 linear ops" if "int8_linear" in graph else \
            f"int8 MACs {q['int8_model_macs_by_dtype']['int8']}"
        text = f"{q['flow']}, {q['swap']['n_swapped']} swapped, {ops}"
        return text + (" (fell back to legacy)" if q.get("flow_fallback") else "")
    if column == "ddp2":
        ddp = d["distributed"]
        return f"world {ddp.get('world_size')}" + (
            f", made contiguous: {ddp['buffers_made_contiguous']}" if ddp.get("buffers_made_contiguous") else "")
    return ""


def cell(pattern: str, column: str) -> dict:
    from lab import RunConfig, run

    overrides = dict(COLUMNS[column])
    top = {k: overrides.pop(k) for k in list(overrides) if "." not in k}
    cfg = RunConfig(workload=f"{HERE / 'zoo_models.py'}:{pattern.upper()}", size="tiny", threads=1,
                    latency_repeats=0, warmup_steps=1, **top).with_overrides(**overrides)
    t0 = time.perf_counter()
    try:
        r = run(cfg, on_error="record")
    except ValueError as exc:  # refused before the work
        return {"status": "refused", "text": str(exc), "s": time.perf_counter() - t0}
    except Exception as exc:  # noqa: BLE001 - a DDP rank's failure is one line too; anything else is a finding
        return {"status": "raised", "text": f"{type(exc).__name__}: {exc}", "s": time.perf_counter() - t0}
    if r.status != "ok":
        return {"status": r.status, "text": r.error, "s": time.perf_counter() - t0}
    return {"status": "ok", "text": effect(r, column), "s": time.perf_counter() - t0,
            "fallback": r.details.get("quant", {}).get("flow_fallback")}


def _reason(text: str) -> str:
    """A refusal's reason without the pattern's own names (one reason per kind of refusal in the legend)."""
    import re

    text = re.sub(r"workload 'zoo_\w+'", "workload W", text)
    text = re.sub(r"(its model \(|^structured_channels: )[A-Z]\w+", r"\1M", text)
    text = re.sub(r"quant\.method='(static|qat)'", "quant.method='static' / 'qat'", text)
    return text.split(": head: ")[0] if text.startswith("structured_channels") else text


def markdown(cells: dict, columns: list[str], patterns: list[str]) -> str:
    """The table: ``ok``, ``ok, fell back (n)``, ``refused (n)`` or ``failed (n)`` per cell, the reasons below."""
    legend: dict[str, int] = {}
    rows = ["| pattern | " + " | ".join(f"`{c}`" for c in columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for pattern in patterns:
        out = []
        for column in columns:
            c = cells.get(f"{pattern}|{column}")
            if c is None:
                out.append("not run")
                continue
            why = c.get("fallback") if c["status"] == "ok" else c["text"]
            n = legend.setdefault(_reason(why), len(legend) + 1) if why else None
            out.append("ok" if n is None else (f"ok, fell back ({n})" if c["status"] == "ok" else
                                                f"{c['status']} ({n})"))
        rows.append(f"| `zoo_{pattern}` | " + " | ".join(out) + " |")
    notes = [f"{n}. {why}" for why, n in legend.items()]
    return "\n".join(rows + [""] + notes)


def main() -> None:
    from zoo_models import PATTERNS

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", help="comma-separated columns")
    p.add_argument("--patterns", help="comma-separated patterns")
    p.add_argument("--json", metavar="PATH", help="write the cells here (appended as they finish)")
    p.add_argument("--markdown", action="store_true", help="print the table of the cells in --json, run nothing")
    args = p.parse_args()
    columns = args.only.split(",") if args.only else list(COLUMNS)
    patterns = args.patterns.split(",") if args.patterns else [p for p in PATTERNS if p != "tuple_out_raw"]
    out = Path(args.json) if args.json else None
    cells = json.loads(out.read_text()) if out and out.exists() else {}
    if args.markdown:
        print(markdown(cells, columns, patterns))
        return
    for pattern in patterns:
        for column in columns:
            key = f"{pattern}|{column}"
            if key in cells:
                continue
            cells[key] = c = cell(pattern, column)
            print(f"{pattern:22s} {column:22s} {c['s']:6.1f}s {c['status']:8s} {c['text'][:300]}", flush=True)
            if out:
                out.write_text(json.dumps(cells, indent=1))


if __name__ == "__main__":
    main()
