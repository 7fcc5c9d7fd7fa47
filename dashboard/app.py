"""Streamlit dashboard: ``make dashboard`` (binds 127.0.0.1, port from PORT=, default 8501).

This first version runs one training configuration through ``lab.run`` with a progress bar, stores it,
and shows where the time went; the ablation view (speedup vs accuracy loss with error bars and the Pareto
front) replaces it when the ablation issue lands. The app stays thin: every number comes from ``lab``.
"""

from __future__ import annotations

import streamlit as st

from lab import ResultStore, RunConfig, get_workload, list_workloads, run
from lab.config import SIZES, PrecisionConfig, PruneConfig, QuantConfig
from lab.plots import loss_curves, phase_breakdown

st.set_page_config(page_title="Training-efficiency lab", layout="wide")
st.title("Training-efficiency lab")
st.caption("Which technique makes *your* training faster, and what does it cost? Measured on this machine.")

with st.sidebar:
    workload = st.selectbox("Workload", list_workloads(), key="workload")
    wl = get_workload(workload)
    st.caption(wl.description)
    size = st.selectbox("Size", SIZES, index=SIZES.index("small"), key="size",
                        help="tiny: seconds (tests); small: under a minute on 2 CPU cores; full: for a GPU")
    seed = st.number_input("Seed", min_value=0, max_value=2**31 - 1, value=0, step=1, key="seed")
    threads = st.number_input("Threads (0 = torch default)", min_value=0, max_value=256, value=0, step=1,
                              key="threads")
    st.subheader("Techniques")
    precision = st.selectbox("Precision", PrecisionConfig.DTYPES, key="precision",
                             help="auto measures a few steps and never keeps a precision slower than fp32")
    prune_method = st.selectbox("Pruning", PruneConfig.METHODS, key="prune_method")
    prune_amount = st.slider("Pruning amount", 0.05, 0.95, 0.5, 0.05, key="prune_amount",
                             disabled=prune_method == "none")
    finetune_epochs = st.number_input("Fine-tune epochs after pruning", 0, 20, 1, key="finetune_epochs",
                                      disabled=prune_method == "none")
    quant_method = st.selectbox("Quantization (int8, CPU)", QuantConfig.METHODS, key="quant_method")
    store_runs = st.checkbox("Store the result", value=True, key="store")
    go_button = st.button("Run", type="primary", key="run")

if go_button:
    overrides = {"precision.dtype": precision, "quant.method": quant_method}
    if prune_method != "none":
        overrides.update({"prune.method": prune_method, "prune.amount": float(prune_amount),
                          "prune.finetune_epochs": int(finetune_epochs)})
    try:
        cfg = RunConfig(workload=workload, size=size, seed=int(seed), threads=int(threads) or None,
                        device="cpu" if quant_method != "none" else "auto").with_overrides(**overrides)
    except (ValueError, NotImplementedError) as exc:
        st.error(f"Invalid settings: {exc}")
        st.stop()
    bar = st.progress(0.0, text="preparing data and model")

    def progress(event: dict) -> None:
        if "total_steps" in event:  # train, and fine-tune / QAT phases after it
            bar.progress(event["step"] / event["total_steps"],
                         text=f"{event['phase']}: step {event['step']}/{event['total_steps']}  "
                              f"loss {event['loss']:.4f}")
        elif event["phase"] == "eval":
            bar.progress(1.0, text="evaluating and measuring inference latency")

    try:
        result = run(cfg, progress=progress, on_error="record")
    except (ValueError, NotImplementedError) as exc:  # refused before any work: a message, not a traceback
        bar.empty()
        st.error(f"Cannot run this combination: {exc}")
        st.stop()
    bar.empty()
    if store_runs:
        with ResultStore() as store:
            store.add(result, label="dashboard")
    st.session_state["result"] = result

result = st.session_state.get("result")
if result is None:
    st.info("Pick a workload and press **Run**. A `small` run takes well under a minute on 2 CPU cores.")
elif result.status != "ok":
    st.error(f"The run failed: {result.error}")
else:
    s = result.summary()
    c1, c2, c3, c4 = st.columns(4)
    delta = f"{result.metric - result.metric_before:+.4f} vs untrained"
    c1.metric(result.metric_name, f"{result.metric:.4f}", delta)
    c2.metric("train time", f"{result.train_time_s:.2f} s")
    c3.metric("throughput", f"{result.throughput_samples_per_s:,.0f} samples/s")
    c4.metric("data wait", f"{100 * result.data_wait_fraction:.1f} %")

    left, right = st.columns(2)
    left.plotly_chart(phase_breakdown([result], labels=["this run"]), key="phases")
    right.plotly_chart(loss_curves([result], labels=["loss"]), key="losses")

    for tag in result.why:
        st.warning(f"Why: {tag}")
    st.subheader("Result")
    st.dataframe({"field": list(s), "value": [str(v) for v in s.values()]}, key="summary")
    families = {k: v for k, v in result.details.items() if k in ("precision", "prune", "quant")}
    if families:
        with st.expander("Technique details"):
            st.json(families, expanded=False)
    with st.expander("Environment stamp"):
        st.json(result.env)

st.subheader("Stored runs")
with ResultStore() as store:
    runs = store.load_runs()
if runs.empty:
    st.caption("No runs stored yet.")
else:
    st.dataframe(runs.sort_values("started_at", ascending=False).head(50), key="runs")
