"""RunConfig validation and serialisation: every bad value fails early and names its field."""

from __future__ import annotations

import dataclasses
import json

import pytest

from lab.config import DataConfig, DDPConfig, PrecisionConfig, PruneConfig, QuantConfig, RunConfig

BAD_TOP = [
    ("workload", "imagenet"), ("workload", 3), ("size", "huge"), ("epochs", 0), ("epochs", 1.5),
    ("epochs", True), ("max_steps", 0), ("batch_size", 0), ("batch_size", -8), ("lr", 0.0), ("lr", -1e-3),
    ("lr", float("nan")), ("lr", "fast"), ("optimizer", "lion"), ("seed", -1), ("data_seed", -2),
    ("device", "tpu"), ("device", "cuda:x"), ("threads", 0), ("warmup_steps", -1), ("eval_batch_size", 0),
    ("latency_repeats", -5),
]


@pytest.mark.parametrize(("field", "value"), BAD_TOP, ids=[f"{f}={v!r}" for f, v in BAD_TOP])
def test_bad_top_level_value_names_the_field(field, value):
    with pytest.raises(ValueError) as err:
        RunConfig(**{field: value})
    msg = str(err.value)
    assert msg.startswith(f"{field}=") and repr(value) in msg and "invalid" in msg


BAD_FAMILY = [
    (DataConfig, "loader", "magic"), (DataConfig, "num_workers", -1), (DataConfig, "prefetch_factor", 0),
    (DataConfig, "pin_memory", "yes"), (PrecisionConfig, "dtype", "fp8"), (PrecisionConfig, "fp32_modules", "fc"),
    (PruneConfig, "method", "magnitude"), (PruneConfig, "amount", 1.0), (PruneConfig, "amount", -0.1),
    (PruneConfig, "schedule", "linear"), (PruneConfig, "finetune_lr_factor", 0.0),
    (QuantConfig, "method", "int4"), (QuantConfig, "calibration_batches", 0), (QuantConfig, "backend", "arm"),
    (DDPConfig, "world_size", 0), (DDPConfig, "backend", "mpi"), (DDPConfig, "grad_accum_steps", 0),
    (DDPConfig, "timeout_s", 0.0), (DDPConfig, "bucket_cap_mb", -1.0),
]


@pytest.mark.parametrize(("cls", "field", "value"), BAD_FAMILY,
                         ids=[f"{c.family}.{f}={v!r}" for c, f, v in BAD_FAMILY])
def test_bad_family_value_names_the_field(cls, field, value):
    with pytest.raises(ValueError) as err:
        cls(**{field: value})
    assert str(err.value).startswith(f"{cls.family}.{field}=")


@pytest.mark.parametrize("kwargs", [
    {"prefetch_factor": 2}, {"persistent_workers": True}, {"loader": "memory", "pin_memory": True},
    {"loader": "memory", "num_workers": 2},
])
def test_data_combinations_that_dataloader_would_reject(kwargs):
    with pytest.raises(ValueError, match=r"^data\."):
        DataConfig(**kwargs)


def test_prune_method_needs_an_amount():
    with pytest.raises(ValueError, match="prune.amount"):
        PruneConfig(method="l1_unstructured")


def test_family_must_have_its_type():
    with pytest.raises(ValueError, match="^data="):
        RunConfig(data={"loader": "memory"})


def test_defaults_are_the_plain_baseline():
    cfg = RunConfig()
    assert cfg.enabled_families() == []
    assert cfg.precision.dtype == "fp32" and cfg.prune.method == "none" and cfg.ddp.world_size == 1


def test_round_trip_exact_including_json():
    cfg = RunConfig(workload="vision", size="tiny", epochs=3, lr=0.01, threads=2, seed=7,
                    data=DataConfig(loader="dataloader", num_workers=2, prefetch_factor=4, pin_memory=True),
                    precision=PrecisionConfig(dtype="bf16", fp32_modules=("fc", "Embedding")),
                    prune=PruneConfig(method="global_unstructured", amount=0.5, schedule="gradual"),
                    quant=QuantConfig(method="static", calibration_batches=4),
                    ddp=DDPConfig(world_size=2, grad_accum_steps=2))
    d = cfg.to_dict()
    assert RunConfig.from_dict(d) == cfg
    assert RunConfig.from_dict(json.loads(json.dumps(d))) == cfg
    assert RunConfig.from_dict(RunConfig().to_dict()) == RunConfig()


def test_from_dict_rejects_unknown_keys():
    with pytest.raises(ValueError, match="unknown RunConfig field"):
        RunConfig.from_dict({"workload": "ctr", "epoch": 3})
    with pytest.raises(ValueError, match="unknown precision field"):
        RunConfig.from_dict({"precision": {"dtype": "fp32", "scaler": True}})


def test_frozen_and_replace_revalidates():
    cfg = RunConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.seed = 3  # type: ignore[misc]
    assert dataclasses.replace(cfg, seed=3).seed == 3
    with pytest.raises(ValueError, match="seed"):
        dataclasses.replace(cfg, seed=-3)


def test_with_overrides_dotted_fields():
    cfg = RunConfig().with_overrides(**{"precision.dtype": "bf16", "data.loader": "dataloader", "seed": 4})
    assert cfg.precision.dtype == "bf16" and cfg.data.loader == "dataloader" and cfg.seed == 4
    assert cfg.enabled_families() == ["data", "precision"]
    with pytest.raises(ValueError, match="unknown family"):
        RunConfig().with_overrides(**{"speed.x": 1})
    with pytest.raises(ValueError, match="has no field"):
        RunConfig().with_overrides(**{"data.workers": 1})


def test_an_int8_config_always_names_its_flow_and_an_old_record_reads_as_legacy():
    """pt2e and legacy must never share a stored hash; a record from before PT2E ran the torch.ao flow."""
    pt2e = RunConfig().with_overrides(**{"quant.method": "static"})
    legacy = pt2e.with_overrides(**{"quant.flow": "legacy"})
    assert pt2e.to_dict()["quant"]["flow"] == "pt2e" and pt2e.to_dict() != legacy.to_dict()
    assert "flow" not in RunConfig().to_dict()["quant"]  # quant off: the baseline's record reads as before
    old = pt2e.to_dict()
    del old["quant"]["flow"]
    assert RunConfig.from_dict(old).quant.flow == "legacy"
    assert RunConfig.from_dict(pt2e.to_dict()) == pt2e
