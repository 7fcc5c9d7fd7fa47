"""CPU offload of the optimizer (memory.offload="optimizer", torchao's CPUOffloadOptimizer): refused in one line
before any work where it cannot run (a CPU device above all: the state already is in host memory there), and on
CUDA verified by its effect: every optimizer state tensor on the host, the parameters on the GPU, no optimizer
state bytes on the device in the run record, and the same losses as the run without it (the same Adam math on the
host). The CUDA test is skipped on a machine without a GPU."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import lab.train
from lab import RunConfig, run
from lab.cli import main
from lab.config import MemoryConfig
from lab.config.flags import field_help
from lab.registry import OPTIONS
from lab.train import check

BASE = RunConfig(workload="mlp", size="tiny", max_steps=3, warmup_steps=1, threads=1, latency_repeats=0)
OFFLOAD = {"memory.offload": "optimizer"}
CUDA_LINE = "memory.offload='optimizer' needs CUDA: torchao's CPUOffloadOptimizer moves the optimizer state"


@pytest.fixture
def no_training(monkeypatch):
    """Fail the test if a run gets as far as preparing its data and model (a refusal must come before)."""
    def prepared(*args, **kwargs):
        raise AssertionError("the run was prepared: the refusal came after work had started")

    monkeypatch.setattr(lab.train, "prepare", prepared)


def test_the_option_and_the_flag_name_the_lever_and_its_values():
    option = OPTIONS["offload_optim"]
    assert option.family == "memory" and option.overrides == OFFLOAD
    cfg = BASE.with_overrides(**OFFLOAD)
    assert cfg.memory.enabled and cfg.memory.offload == "optimizer"
    f = next(f for f in dataclasses.fields(MemoryConfig) if f.name == "offload")
    text = field_help("memory.offload", f)
    assert "host memory" in text and "none" in text and "optimizer" in text
    with pytest.raises(ValueError, match="memory.offload"):
        BASE.with_overrides(**{"memory.offload": "gradients"})


def test_a_stored_memory_runs_config_reads_as_before_the_field_existed():
    low_bit = BASE.with_overrides(**{"memory.optimizer_state": "int8"}).to_dict()
    assert "offload" not in low_bit["memory"]  # its hash is unchanged
    assert RunConfig.from_dict(low_bit).memory.offload == "none"
    on = BASE.with_overrides(**OFFLOAD).to_dict()
    assert on["memory"]["offload"] == "optimizer" and RunConfig.from_dict(on).memory.offload == "optimizer"


def test_on_a_cpu_device_the_cli_refuses_it_in_one_line_before_any_work(no_training, capsys):
    code = main(["run", "--workload", "mlp", "--size", "tiny", "--device", "cpu", "--memory-offload", "optimizer",
                 "--no-store"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err and CUDA_LINE in err, err
    assert "there is nothing to offload" in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="device auto is CUDA on this machine")
def test_on_a_machine_without_cuda_a_run_refuses_it_before_any_work(no_training):
    with pytest.raises(ValueError, match="needs CUDA") as err:
        run(BASE.with_overrides(**OFFLOAD))
    assert str(err.value).startswith("memory.offload='optimizer' is invalid on device 'cpu'")
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(("overrides", "needle"), [
    ({"optimizer": "sgd"}, "use --optimizer adam"),
    ({"memory.optimizer_state": "int8"}, "choose one"),
    ({"memory.shard": "fsdp2", "ddp.world_size": 2}, "CPUOffloadPolicy"),
    ({"ddp.world_size": 2}, "single-GPU"),
    ({"compute.fused_optimizer": True}, "no device update left to fuse"),
    ({"precision.dtype": "fp16"}, "GradScaler"),
    ({"precision.dtype": "auto"}, "GradScaler"),
    ({"checkpoint_every": 5}, "stale copy"),
    ({"resume": "latest"}, "stale copy"),
])
def test_what_cannot_run_with_it_is_refused_by_name_on_any_machine(overrides, needle):
    from lab.memory import Memory

    cfg = BASE.with_overrides(**{**OFFLOAD, "device": "cpu", **overrides})
    with pytest.raises(ValueError, match=needle) as err:
        Memory().check(cfg)
    assert str(err.value).startswith("memory.offload='optimizer' is invalid with") and "\n" not in str(err.value)


def test_the_refusal_is_what_a_run_check_raises(no_training):
    with pytest.raises(ValueError, match="use --optimizer adam"):
        check(BASE.with_overrides(**{**OFFLOAD, "device": "cpu", "optimizer": "sgd"}))


def test_the_recipe_refuses_it_with_the_reason():
    from lab.memory.portable import portable
    from lab.technique import NotPortable

    with pytest.raises(NotPortable, match="CUDA only"):
        portable(BASE.with_overrides(**OFFLOAD))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_the_state_is_on_the_host_the_params_on_the_gpu_and_the_losses_the_plain_runs():
    from lab.measure.memory import optimizer_state_bytes
    from lab.technique import FitPlan, Technique, TechniqueChain, default_chain

    kept: list[torch.optim.Optimizer] = []
    trained: list[torch.nn.Module] = []

    class Keep(Technique):
        """Keeps the model and the optimizer the fit builds, without changing them."""

        name = "keep_optimizer"

        def fit_options(self, ctx, model, plan: FitPlan) -> None:
            make = plan.optimizer
            assert make is not None, "the memory family set no optimizer factory"
            trained.append(model)

            def keep(params, lr):
                kept.append(make(params, lr))
                return kept[-1]

            plan.optimizer = keep

    cfg = BASE.with_overrides(device="cuda", seed=3)
    plain = run(cfg)
    off = run(cfg.with_overrides(**OFFLOAD), techniques=TechniqueChain([*default_chain(), Keep()]))
    assert plain.status == off.status == "ok" and len(kept) == 1
    opt, model = kept[0], trained[0]
    assert type(opt).__mro__[1].__name__ == "CPUOffloadOptimizer"
    states = [t for s in opt.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
    params = [p for p in model.parameters() if p.requires_grad]
    assert len(opt.state) == len(params) and opt.d_opt is None  # every trainable tensor offloaded
    assert states and all(t.device.type == "cpu" for t in states)
    assert all(p.device.type == "cuda" for p in params)
    assert all(h.is_pinned() and h.grad.is_pinned() for h in opt.param_d2h_map.values())  # torchao pins the copies
    mem = off.details["memory"]
    assert mem["offload"] == "optimizer" and mem["optimizer_state_device_bytes"] == 0
    assert mem["optimizer_state_host_bytes"] == mem["optimizer_state_bytes"] == optimizer_state_bytes(opt) > 0
    assert plain.details["memory"]["optimizer_state_bytes"] == mem["optimizer_state_bytes"]  # the same Adam state
    assert len(plain.losses) == len(off.losses) == 3
    for a, b in zip(plain.losses, off.losses, strict=True):
        assert abs(a - b) <= 1e-5 * abs(a), (plain.losses, off.losses)


def test_the_labs_path_on_the_cpu_with_torchaos_streams_faked_gives_the_plain_runs_losses_and_record(monkeypatch):
    """The plumbing, on any machine: torchao's own CPUOffloadOptimizer, built and stepped through the lab's fit,
    with only its CUDA parts faked (the device probe, the side stream, pinned allocation), so the lab's wrapper
    (state, defaults, param_groups), the fit's optimizer, the run record and the step description are exercised
    here; the offload itself is the CUDA test's."""
    import contextlib

    import torchao.optim.cpu_offload as cpu_offload

    import lab.memory.offload

    class Stream:
        def wait_stream(self, other): pass

        def record_event(self):
            return Stream()

        def synchronize(self): pass

    fake_cuda = type("FakeCuda", (), {"Stream": Stream, "current_stream": staticmethod(Stream),
                                      "stream": staticmethod(lambda s: contextlib.nullcontext())})

    def empty_like(t, *args, pin_memory=False, **kwargs):
        return torch.empty_like(t, *args, **kwargs)

    fake_torch = type("FakeTorch", (), {"cuda": fake_cuda, "empty_like": staticmethod(empty_like),
                                        "no_grad": torch.no_grad, "optim": torch.optim})
    monkeypatch.setattr(cpu_offload, "get_available_devices", lambda: ["cpu", "cuda"])
    monkeypatch.setattr(cpu_offload, "torch", fake_torch)
    monkeypatch.setattr(lab.memory.offload, "resolve_device", lambda name: torch.device("cuda"))
    cfg = BASE.with_overrides(seed=3, device="cpu")  # the model on the CPU, whatever the machine has
    plain, off = run(cfg), run(cfg.with_overrides(**OFFLOAD))
    mem = off.details["memory"]
    assert mem["offload"] == "optimizer" and mem["optimizer"] == "OffloadedAdam"
    assert mem["optimizer_state_device_bytes"] == 0 < mem["optimizer_state_host_bytes"] == mem["optimizer_state_bytes"]
    assert mem["optimizer_state_bytes"] == plain.details["memory"]["optimizer_state_bytes"]  # Adam's state, all of it
    assert off.details["steps"]["train"]["fused"] is True
    assert off.losses == pytest.approx(plain.losses, rel=1e-6) and len(off.losses) == 3  # AdamW at decay 0 is Adam
