"""The one device rule, the peak table MFU divides by, and the utilisation figures of a metrics row."""

import copy
import logging

import pytest
import torch

from factory import devices
from factory.config.schema import ModelConfig
from factory.devices import device_for, flops_per_token, peak_flops, where
from factory.models.build import build_model
from factory.train.distributed import World, backend_for
from factory.train.parallel import implementation_here
from factory.train.utilisation import Utilisation, lookup_parameters

needs_no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="checks what a machine without GPUs does")


@needs_no_gpu
def test_a_stage_computes_on_the_gpus_its_placement_gives_it_and_a_local_run_without_any_is_told_once(caplog, monkeypatch):
    monkeypatch.setattr(devices, "_warned", set())
    assert device_for(0) == torch.device("cpu") and device_for(None) == torch.device("cpu")
    assert not caplog.records, "no GPUs asked for: nothing to say"
    log = logging.getLogger("test.devices")
    with caplog.at_level(logging.WARNING):
        assert device_for(2, 1, log) == torch.device("cpu")
        assert device_for(2, 0, log) == torch.device("cpu")
    [said] = [r.getMessage() for r in caplog.records]
    assert said == "resources.gpus asks for 2 GPU(s), but this machine has none: the stage runs on the CPU"
    assert World(gpus=0).device == torch.device("cpu")


@needs_no_gpu
def test_ranks_meet_over_gloo_on_the_cpu_even_where_the_placement_asked_for_nccl():
    assert backend_for(World(rank=0, size=2, gpus=2), "nccl") == "gloo", "no GPUs here: NCCL cannot run"
    assert backend_for(World(rank=0, size=2, gpus=0), None) == "gloo"
    assert backend_for(World(rank=0, size=2, gpus=0), "gloo") == "gloo"


def test_plan_names_a_placement_by_its_device():
    assert (where(0), where(8), where(None)) == ("cpu", "cuda x8", "auto")


@pytest.mark.parametrize(("name", "tflops"), [
    ("NVIDIA H100 80GB HBM3", 989.0), ("NVIDIA H100 PCIe", 756.0), ("NVIDIA H200", 989.0), ("NVIDIA A100-SXM4-80GB", 312.0),
    ("NVIDIA L4", 121.0), ("NVIDIA GeForce RTX 4090", None),
])
def test_the_peak_of_a_known_gpu_comes_from_the_table_and_an_unknown_one_has_none(monkeypatch, name, tflops):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    assert peak_flops(torch.device("cuda", 0)) == (None if tflops is None else tflops * 1e12)
    assert peak_flops(torch.device("cpu")) is None


def test_flops_per_token_count_the_weights_that_multiply_and_attention_over_the_context():
    tied = build_model(ModelConfig(n_layer=2, n_head=2, n_embd=32, context=16), 100, 0)  # learned positions, tied head
    untied = build_model(ModelConfig(arch="llama", n_layer=2, n_head=2, n_embd=32, context=16, positions="rotary",
                                     tie_embeddings=False), 100, 0)
    assert lookup_parameters(tied) == 16 * 32, "the position table is looked up; the tied token table also multiplies"
    assert lookup_parameters(untied) == 100 * 32, "the untied token table is only looked up"
    parameters = sum(p.numel() for p in untied.parameters())
    assert flops_per_token(parameters, 2, 32, 16, embedding=100 * 32) == 6 * (parameters - 3200) + 12 * 2 * 32 * 16


def test_a_metrics_row_on_a_gpu_carries_tokens_per_gpu_and_mfu_and_on_the_cpu_nothing():
    on_two = Utilisation(flops_per_token=1e9, gpus=2, peak=1e15)
    assert on_two.row(400_000.0) == {"flops_per_token": 1_000_000_000, "tokens_per_second_per_gpu": 200_000.0, "mfu": 0.2}
    assert "mfu" not in Utilisation(flops_per_token=1e9, gpus=1, peak=None).row(1000.0), "an unknown GPU: no guess"
    assert Utilisation(flops_per_token=None).row(1000.0) == {}


def test_a_checkpoint_written_with_fused_adamw_on_a_gpu_resumes_with_the_cpus_implementation():
    """Resumed on the CPU, the run steps as an unbroken CPU run does (the checkpoint's `fused` flag would pick CPU-fused
    AdamW, whose numbers differ)."""
    generator = torch.Generator().manual_seed(0)
    weights, grads = torch.randn(64, 64, generator=generator), [torch.randn(64, 64, generator=generator) for _ in range(2)]
    unbroken = torch.nn.Parameter(weights.clone())
    optimizer = torch.optim.AdamW([unbroken], lr=1e-2)
    unbroken.grad = grads[0].clone()
    optimizer.step()
    saved = copy.deepcopy(optimizer.state_dict())  # as read back from a file: nothing shared with the live optimizer
    saved["param_groups"][0]["fused"] = True  # as a run on a GPU saves it
    resumed = torch.nn.Parameter(unbroken.detach().clone())
    here = torch.optim.AdamW([resumed], lr=1e-2)
    here.load_state_dict({**saved, "param_groups": implementation_here(saved["param_groups"], here)})
    assert here.param_groups[0]["fused"] is None
    for parameter, step in ((unbroken, optimizer), (resumed, here)):
        parameter.grad = grads[1].clone()
        step.step()
    assert torch.equal(unbroken, resumed)
