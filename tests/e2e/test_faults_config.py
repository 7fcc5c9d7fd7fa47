"""The fault suite (issue 17; helpers in faults_common.py), the API: a bad RunConfig is a ValueError naming the field;
hypothesis properties over every field (any invalid value names its field, a valid config round-trips through dict,
JSON and the CLI)."""

from __future__ import annotations

import dataclasses
import json
import math
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lab.cli import build_parser, config_from_args
from lab.config import (
    FAMILIES,
    MODEL_SCALES,
    OPTIMIZERS,
    SIZES,
    ComputeConfig,
    DataConfig,
    DDPConfig,
    MemoryConfig,
    PrecisionConfig,
    PruneConfig,
    QuantConfig,
    RunConfig,
)
from lab.registry import LOADERS, STORAGES
from lab.workloads import list_workloads

API_BAD = [
    (lambda: RunConfig.from_dict([("workload", "ctr")]), "RunConfig.from_dict needs a mapping"),
    (lambda: RunConfig.from_dict(None), "RunConfig.from_dict needs a mapping"),
    (lambda: RunConfig.from_dict({"workload": "ctr", "epoch": 3}), "unknown RunConfig field(s): epoch"),
    (lambda: RunConfig.from_dict({1: 2}), "unknown RunConfig field(s): 1"),
    (lambda: RunConfig.from_dict({"ddp": 3}), "ddp=3 is invalid"),
    (lambda: RunConfig.from_dict({"ddp": {"world_size": "2"}}), "ddp.world_size='2'"),
    (lambda: RunConfig.from_dict({"ddp": {"size": 2}}), "unknown ddp field(s): size"),
    (lambda: RunConfig.from_dict({"precision": {"dtype": "bf16", "fp32_modules": "fc"}}), "precision.fp32_modules"),
    (lambda: RunConfig().with_overrides(batchsize=64), "unknown RunConfig field(s): batchsize"),
    (lambda: RunConfig().with_overrides(**{"ddp.size": 2}), "ddp has no field 'size'"),
    (lambda: RunConfig().with_overrides(**{"speed.x": 1}), "unknown family 'speed'"),
    (lambda: RunConfig().with_overrides(data="thread"), "data='thread' is invalid"),
    (lambda: RunConfig(workload=["ctr"]), "workload=['ctr'] is invalid"),
    (lambda: RunConfig(workload_spec=3), "workload_spec=3 is invalid"),
    (lambda: RunConfig(threads=(os.cpu_count() or 1) + 1), "threads="),
    (lambda: RunConfig(max_steps=3, warmup_steps=3), "warmup_steps=3"),
    (lambda: dataclasses.replace(RunConfig(), seed="x"), "seed='x'"),
    (lambda: PruneConfig(method="l1_unstructured", amount=0.5, layers=["fc"]), "prune.layers=['fc']"),
    (lambda: DDPConfig(world_size=2, timeout_s=math.inf), "ddp.timeout_s=inf"),
    (lambda: MemoryConfig(checkpoint="layers"), "memory.checkpoint='layers'"),
    (lambda: RunConfig.from_dict({"memory": {"optimizer_state": "int2"}}), "memory.optimizer_state='int2'"),
]


@pytest.mark.parametrize(("make", "needle"), API_BAD, ids=[n for _, n in API_BAD])
def test_api_bad_config_is_a_value_error_naming_the_field(make, needle):
    with pytest.raises(ValueError) as err:
        make()
    assert needle in str(err.value) and "\n" not in str(err.value)


# -------------------------------------------------------------------------------- hypothesis properties
def _top_fields() -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(RunConfig) if f.name not in FAMILIES]


#: The names a str field allows (anything else is invalid), per qualified field name.
CHOICES: dict[str, tuple[str, ...]] = {
    "size": SIZES, "optimizer": OPTIMIZERS, "data.loader": LOADERS.names(), "data.storage": STORAGES.names(),
    "precision.dtype": PrecisionConfig.DTYPES, "prune.method": PruneConfig.METHODS,
    "prune.schedule": PruneConfig.SCHEDULES, "quant.method": QuantConfig.METHODS,
    "quant.observer": QuantConfig.OBSERVERS, "quant.backend": ("auto", "x86", "fbgemm", "qnnpack"),
    "ddp.backend": DDPConfig.BACKENDS, "data.source": DataConfig.SOURCES, "quant.flow": QuantConfig.FLOWS,
    "quant.reduce_range": QuantConfig.REDUCE_RANGE,
    "model_scale": MODEL_SCALES, "ddp.shard": DDPConfig.SHARDS, "ddp.shard_order": DDPConfig.SHARD_ORDERS,
    "memory.checkpoint": MemoryConfig.CHECKPOINTS, "memory.optimizer_state": MemoryConfig.OPTIMIZER_STATES,
    "memory.shard": MemoryConfig.SHARDS, "memory.offload": MemoryConfig.OFFLOADS,
}


def _valid_device(text: str) -> bool:
    return text in ("auto", "cpu", "cuda") or (text.startswith("cuda:") and text[5:].isdigit())


def invalid_values(key: str, annotation: str) -> st.SearchStrategy:
    """Values no field of this type accepts (all int fields are >= 0, all float fields >= 0, finite)."""
    optional = "None" in annotation
    junk = st.one_of(st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=2), st.integers(),
                                                                          max_size=1))
    none = st.nothing() if optional else st.none()
    if annotation == "bool":
        return st.one_of(st.integers(), st.text(max_size=3), st.none(), st.floats(), junk)
    if annotation.startswith("int"):
        return st.one_of(st.integers(max_value=-1), st.text(max_size=3), st.booleans(), st.floats(), junk, none)
    if annotation.startswith("float"):
        return st.one_of(st.floats(max_value=-1e-6), st.sampled_from([math.nan, math.inf, -math.inf]),
                         st.text(max_size=3), st.booleans(), junk, none)
    if annotation.startswith("tuple"):
        return st.one_of(st.text(min_size=1, max_size=3), st.lists(st.text(min_size=1, max_size=3), min_size=1,
                                                                   max_size=2),
                         st.tuples(st.integers()), st.just(("",)), st.none())
    if key == "workload_spec":
        return st.one_of(st.integers(), st.booleans(), junk)
    if key == "workload":
        names = set(list_workloads())
        return st.one_of(st.text(max_size=8).filter(lambda s: ":" not in s and s not in names), st.integers(),
                         st.none(), junk)
    if key == "resume":  # a run id or a path: any non-blank string is accepted
        return st.one_of(st.just(""), st.just("  "), st.integers(), st.booleans(), junk)
    if key == "model_scale":  # optional: None keeps the workload's own model
        return st.one_of(st.text(max_size=8).filter(lambda s: s not in MODEL_SCALES), st.integers(), junk)
    if key == "device":
        return st.one_of(st.text(max_size=8).filter(lambda s: not _valid_device(s)), st.integers(), st.none(), junk)
    return st.one_of(st.text(max_size=8).filter(lambda s: s not in CHOICES[key]), st.integers(), st.none(), junk)


FIELD_KEYS = [(f.name, str(f.type)) for f in _top_fields()] + [
    (f"{fam}.{f.name}", str(f.type)) for fam, cls in FAMILIES.items() for f in dataclasses.fields(cls)]


#: The str fields :func:`invalid_values` handles by name, not by :data:`CHOICES`.
_FREE_TEXT = {"workload", "workload_spec", "resume", "model_scale", "device"}


def test_every_choice_field_has_its_choices_here() -> None:
    """Every str field outside :data:`_FREE_TEXT` is in :data:`CHOICES`: a field added without its choices fails
    here at once, not only when hypothesis happens to draw it (``memory.offload`` did, one run in several)."""
    str_fields = [k for k, a in FIELD_KEYS if a in ("str", "str | None") and k not in _FREE_TEXT]
    assert [k for k in str_fields if k not in CHOICES] == []


@st.composite
def invalid_field(draw) -> tuple[str, object]:
    key, annotation = draw(st.sampled_from(FIELD_KEYS))
    return key, draw(invalid_values(key, annotation))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(invalid_field())
def test_property_any_invalid_value_of_any_field_names_that_field(case):
    key, value = case
    with pytest.raises(ValueError) as err:
        if "." in key:
            RunConfig().with_overrides(**{key: value})
        else:
            RunConfig(**{key: value})
    assert str(err.value).startswith(f"{key}="), (key, value, str(err.value))


@settings(max_examples=50, deadline=None)
@given(st.sampled_from(list(FAMILIES)), st.one_of(st.none(), st.integers(), st.text(max_size=4),
                                                  st.dictionaries(st.text(max_size=3), st.integers(), max_size=2)))
def test_property_a_family_that_is_not_its_config_names_the_family(family, value):
    with pytest.raises(ValueError) as err:
        RunConfig(**{family: value})
    assert str(err.value).startswith(f"{family}=")


NAMES = st.lists(st.from_regex(r"[A-Za-z_][A-Za-z0-9_.]{0,7}", fullmatch=True), min_size=1, max_size=3,
                 unique=True).map(tuple)
POS = st.floats(min_value=1e-4, max_value=9.0, allow_nan=False)


@st.composite
def valid_configs(draw) -> RunConfig:
    """Any config the lab accepts: each family off (its default) or on with a consistent combination."""
    loader = draw(st.sampled_from(LOADERS.names()))
    spec = LOADERS.get(loader)
    if loader == "memory":
        data = DataConfig(shuffle=draw(st.booleans()), drop_last=draw(st.booleans()))
    else:
        workers = draw(st.integers(0, 8)) if spec.worker_processes else 0
        data = DataConfig(loader=loader, storage=draw(st.sampled_from(STORAGES.names())), num_workers=workers,
                          prefetch_factor=draw(st.none() | st.integers(1, 8)) if workers else None,
                          persistent_workers=draw(st.booleans()) if workers else False,
                          pin_memory=draw(st.booleans()) if spec.worker_processes else False,
                          prefetch_depth=draw(st.integers(1, 64)) if spec.prefetch_depth else 2,
                          shuffle=draw(st.booleans()), drop_last=draw(st.booleans()))
    dtype = draw(st.sampled_from(PrecisionConfig.DTYPES))
    precision = PrecisionConfig(dtype=dtype, fp32_modules=draw(st.just(()) | NAMES) if dtype != "fp32" else ())
    method = draw(st.sampled_from(PruneConfig.METHODS))
    prune = PruneConfig()
    if method != "none":
        start = draw(st.floats(0.0, 0.5))
        prune = PruneConfig(method=method, amount=draw(st.floats(0.01, 0.99)),
                            schedule="oneshot" if method == "structured_channels" else draw(
                                st.sampled_from(PruneConfig.SCHEDULES)),
                            finetune_epochs=draw(st.integers(0, 5)), finetune_lr_factor=draw(POS),
                            layers=draw(st.just(()) | NAMES), norm=draw(st.sampled_from([1, 2])),
                            start_fraction=start, end_fraction=draw(st.floats(start + 0.01, 0.99)),
                            frequency_steps=draw(st.integers(1, 1000)))
    qmethod = draw(st.sampled_from(QuantConfig.METHODS))
    quant = QuantConfig() if qmethod == "none" else QuantConfig(
        method=qmethod, calibration_batches=draw(st.integers(1, 1000)), backend=draw(st.sampled_from(
            CHOICES["quant.backend"])), observer=draw(st.sampled_from(QuantConfig.OBSERVERS)),
        per_channel=draw(st.booleans()), qat_epochs=draw(st.integers(1, 5)), qat_lr_factor=draw(POS))
    world, accum = draw(st.integers(1, 8)), draw(st.integers(1, 8))
    ddp = DDPConfig() if world == accum == 1 else DDPConfig(
        world_size=world, grad_accum_steps=accum, backend=draw(st.sampled_from(DDPConfig.BACKENDS)),
        bucket_cap_mb=draw(st.floats(0.01, 4096.0)), timeout_s=draw(st.floats(0.5, 86_400.0)))
    if world > 1 and draw(st.booleans()):  # per-rank shards (issue 18)
        ddp = dataclasses.replace(ddp, shard=draw(st.sampled_from(DDPConfig.SHARDS[1:])),
                                  shard_order=draw(st.sampled_from(DDPConfig.SHARD_ORDERS)))
    max_steps = draw(st.none() | st.integers(1, 10**6))
    return RunConfig(
        workload=draw(st.sampled_from(["ctr", "sequence", "vision"])), size=draw(st.sampled_from(SIZES)),
        epochs=draw(st.none() | st.integers(1, 10_000)), max_steps=max_steps,
        batch_size=draw(st.none() | st.integers(1, 1 << 20)), lr=draw(st.none() | POS),
        optimizer=draw(st.sampled_from(OPTIMIZERS)), seed=draw(st.integers(0, 2**32 - 1)),
        data_seed=draw(st.integers(0, 2**32 - 1)), device=draw(st.sampled_from(["auto", "cpu", "cuda", "cuda:1"])),
        threads=draw(st.none() | st.integers(1, os.cpu_count() or 1)),
        warmup_steps=draw(st.integers(0, min(10_000, (max_steps or 10_001) - 1))),
        eval_batch_size=draw(st.integers(1, 1 << 20)), latency_repeats=draw(st.integers(0, 100_000)),
        data=data, precision=precision, prune=prune, quant=quant, ddp=ddp,
        compute=ComputeConfig(fused_optimizer=draw(st.booleans()), fast_kernels=draw(st.booleans()),
                              compile=draw(st.booleans())),
        memory=MemoryConfig(checkpoint=draw(st.sampled_from(MemoryConfig.CHECKPOINTS)),
                            optimizer_state=draw(st.sampled_from(MemoryConfig.OPTIMIZER_STATES))))


def to_argv(cfg: RunConfig) -> list[str]:
    """The ``lab run`` flags that give ``cfg`` (only values that differ from the defaults)."""
    argv = ["run", "--workload", cfg.workload]
    pairs = [(f.name, getattr(cfg, f.name), f.default) for f in _top_fields() if f.name != "workload"]
    for fam, cls in FAMILIES.items():
        default = cls()
        pairs += [(f"{fam}.{f.name}", getattr(getattr(cfg, fam), f.name), getattr(default, f.name))
                  for f in dataclasses.fields(cls)]
    for key, value, default in pairs:
        if value == default and type(value) is type(default):
            continue
        flag = "--" + key.replace(".", "-").replace("_", "-")
        if isinstance(value, bool):
            argv.append(flag if value else "--no-" + flag[2:])
        elif value is None:
            argv += [flag, "none"]
        elif isinstance(value, tuple):
            argv += [flag, ",".join(value)]
        else:
            argv += [flag, repr(value) if isinstance(value, float) else str(value)]
    return argv


@settings(max_examples=150, deadline=None)
@given(valid_configs())
def test_property_valid_config_round_trips_dict_json_and_cli(cfg):
    assert RunConfig.from_dict(cfg.to_dict()) == cfg
    assert RunConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    args = build_parser().parse_args(to_argv(cfg))
    assert config_from_args(args) == cfg
