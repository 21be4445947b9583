"""The cost figures: clocks that tell CPU from wall, FLOP accounting, tokens from the trainer, the line."""

from __future__ import annotations

import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
import torch

from alignflow.evaluation import cost

BUSY = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass"


def busy(seconds: float) -> None:
    """Spin until this process has used ``seconds`` of CPU (wall time varies with the load)."""
    started = time.process_time()
    while time.process_time() - started < seconds:
        pass


def test_cpu_seconds_count_a_busy_loop_and_not_a_sleep():
    _, spun = cost.timed(lambda: busy(0.3))
    assert spun[cost.CPU_SECONDS] >= 0.3
    assert spun[cost.WALL_SECONDS] >= 0.3 * 0.9, "wall time is at least the CPU time of one thread"
    _, slept = cost.timed(lambda: time.sleep(0.3))
    assert slept[cost.WALL_SECONDS] >= 0.3
    assert slept[cost.CPU_SECONDS] < 0.1, "sleeping costs wall time, not CPU time"


def test_cpu_seconds_count_a_child_process_once_it_has_exited():
    _, spent = cost.timed(lambda: subprocess.run([sys.executable, "-c", BUSY], check=True))
    assert spent[cost.CPU_SECONDS] >= 0.3, "an `accelerate launch` worker's CPU is the stage's"


def test_no_gpu_seconds_without_cuda():
    if torch.cuda.is_available():
        pytest.skip("a CUDA machine: its GPU seconds are wall x devices")
    assert cost.timed(lambda: None)[1][cost.GPU_SECONDS] == 0.0


def test_mfu_of_a_known_token_count_and_time_against_a_fixed_peak():
    # 6e6 FLOPs a token x 10k tokens = 6e10 FLOPs in 2 s = 3e10 FLOP/s, of a 1e11 peak
    assert cost.training_flops(6e6, 10_000) == 6e10
    assert cost.mfu(6e6, 10_000, 2.0, 1e11) == pytest.approx(0.3)
    assert cost.mfu(6e6, 10_000, 4.0, 1e11) == pytest.approx(0.15), "twice the time, half the MFU"


class _Encoder(torch.nn.Module):
    """A big vocabulary looked up, two small layers multiplied."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(10_000, 8)
        self.body = torch.nn.Linear(8, 8, bias=False)
        self.head = torch.nn.Linear(8, 1, bias=False)


def test_flops_per_token_count_multiplied_weights_and_what_trains():
    model = _Encoder()
    multiplied = 8 * 8 + 8
    # full training: forward 2 + input gradients 2 + weight gradients 2, the table not at all
    # (counting it made a MiniLM reward stage report an MFU of 2.1)
    assert cost.flops_per_token(model) == 6 * multiplied
    model.body.weight.requires_grad_(False)  # only the head trains, as LoRA-like training does
    assert cost.flops_per_token(model) == 4 * multiplied + 2 * 8
    model.requires_grad_(False)
    assert cost.flops_per_token(model) == 2 * multiplied, "a frozen model: the forward only"


def test_no_input_gradient_is_counted_below_the_lowest_layer_that_trains():
    """Frozen lower layers (the reward stage's ``freeze_layers``) pass no gradient down: only
    the layers above the lowest trained one compute the gradient of their input."""
    model = _Encoder()
    model.embed.requires_grad_(False)
    model.body.requires_grad_(False)
    # the head trains; nothing below it does, so not even the head's input needs a gradient
    assert cost.flops_per_token(model) == 2 * (8 * 8 + 8) + 2 * 8
    model.body.requires_grad_(True)
    assert cost.flops_per_token(model) == 2 * (8 * 8 + 8) + 2 * 8 + 2 * (8 * 8 + 8)


def test_a_tied_output_head_is_counted_once():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=100, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, tie_word_embeddings=True,
    )  # fmt: skip
    model = LlamaForCausalLM(config)
    layers = 16 * 16 * 4 + 16 * 32 * 3  # q, k, v, o (2 heads x 8 = 16) and the MLP
    assert cost.flops_per_token(model) == 6 * (layers + 100 * 16)


def test_the_peak_is_measured_once_per_process_and_is_positive():
    cost.peak_gflops.cache_clear()
    first = cost.peak_gflops("float32", "cpu")
    assert first > 0.1, "any CPU multiplies faster than 0.1 GFLOP/s"
    started = time.perf_counter()
    assert cost.peak_gflops("float32", "cpu") == first
    assert time.perf_counter() - started < 0.1, "the second call reads the cache"


def trainer(seen: int = 0, initial: int = 0, **counters: int) -> SimpleNamespace:
    args = SimpleNamespace(device="cpu", world_size=1, n_gpu=0, bf16=False, fp16=False)
    state = SimpleNamespace(num_input_tokens_seen=seen)
    return SimpleNamespace(
        args=args,
        state=state,
        model=torch.nn.Linear(10, 10),
        _initial_num_input_tokens_seen=initial,
        **counters,
    )


def test_tokens_trained_are_what_this_train_call_ran():
    assert cost.tokens_trained(trainer(seen=1500, initial=500)) == 1000, "a resume's earlier tokens left out"
    assert cost.tokens_trained(trainer(_total_train_tokens=700)) == 700, "TRL's own counter"
    assert cost.tokens_trained(trainer()) is None, "no count, no figure"


def test_training_cost_prices_the_trainer_against_the_measured_peak():
    figures, tags = cost.training_cost(trainer(_total_train_tokens=1000), train_seconds=2.0)
    assert figures[cost.TOKENS_TRAINED] == 1000
    assert figures[cost.PEAK_GFLOPS] == cost.peak_gflops("float32", "cpu")
    # a Linear(10, 10) multiplies by 100 weights (the bias is an add): forward and its weights'
    # gradient; its input is the data, which needs no gradient
    achieved = 4 * 100 * 1000 / 2.0
    assert figures[cost.MFU] == pytest.approx(achieved / (figures[cost.PEAK_GFLOPS] * 1e9))
    assert tags[cost.DEVICE_TAG] and tags[cost.DTYPE_TAG] == "float32"
    bf16 = trainer(_total_train_tokens=1000)
    bf16.model = bf16.model.to(torch.bfloat16)
    figures, tags = cost.training_cost(bf16, train_seconds=2.0)
    assert tags[cost.DTYPE_TAG] == "bfloat16", "the weights' dtype, as they ran"
    assert figures[cost.PEAK_GFLOPS] == cost.peak_gflops("bfloat16", "cpu"), "the peak of the dtype that ran"
    assert cost.training_cost(trainer(), train_seconds=2.0) == ({}, {}), "nothing trained, nothing priced"


def test_totals_add_up_the_stages_and_leave_rates_out():
    stages = [
        {cost.WALL_SECONDS: 10.0, cost.CPU_SECONDS: 15.0, cost.TOKENS_TRAINED: 1000.0, cost.MFU: 0.2},
        {cost.WALL_SECONDS: 5.0, cost.CPU_SECONDS: 4.0},
    ]
    assert cost.totals(stages) == {
        cost.WALL_SECONDS: 15.0,
        cost.CPU_SECONDS: 19.0,
        cost.TOKENS_TRAINED: 1000.0,
    }


def test_the_cost_line_prices_a_gain_in_cpu_minutes_per_hundredth():
    spent = {cost.CPU_SECONDS: 600.0, cost.TOKENS_TRAINED: 1_234_567.0}
    line = cost.cost_line(spent, gain=0.05)
    assert line == (
        "Cost: 10.0 CPU-minutes, 1.2M tokens trained; "
        "2.00 CPU-minutes per +0.01 task accuracy over the reference"
    )
    assert cost.cost_line(spent, gain=0.0).endswith("; no improvement to price")
    assert cost.cost_line(spent, gain=-0.1).endswith("; no improvement to price")
    assert cost.cost_line(spent) == "Cost: 10.0 CPU-minutes, 1.2M tokens trained"
    reused = cost.cost_line(spent | {cost.GPU_SECONDS: 90.0}, reused=["sft"])
    assert reused == (
        "Cost: 10.0 CPU-minutes, 1.5 GPU-minutes, 1.2M tokens trained "
        "(sft reused from earlier runs, counted at what they cost there)"
    )
    on_a_gpu = cost.cost_line(spent | {cost.GPU_SECONDS: 90.0}, gain=0.05)
    assert on_a_gpu.endswith("; 0.30 GPU-minutes per +0.01 task accuracy over the reference"), on_a_gpu
