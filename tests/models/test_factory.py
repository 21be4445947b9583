import torch

from alignflow.models import load_causal_lm


def test_tiny_model_reloads_and_generates(tiny_model_dir):
    model, tokenizer = load_causal_lm(tiny_model_dir)
    assert (tiny_model_dir / "model.safetensors").exists()
    assert not list(tiny_model_dir.glob("*.bin")), "weights must be safetensors only"
    ids = tokenizer("What is 2 plus 3?", return_tensors="pt")
    out = model.generate(**ids, max_new_tokens=5, do_sample=False)
    assert out.shape[1] > ids.input_ids.shape[1]
    assert tokenizer.decode(tokenizer("The answer is 5.").input_ids) == "The answer is 5."


def test_tiny_model_is_deterministic(tmp_path, demo_records):
    from alignflow.models import build_tiny_model

    texts = [r["prompt"] for r in demo_records]
    a = build_tiny_model(texts, tmp_path / "a")
    b = build_tiny_model(texts, tmp_path / "b")
    wa, _ = load_causal_lm(a)
    wb, _ = load_causal_lm(b)
    for pa, pb in zip(wa.parameters(), wb.parameters(), strict=True):
        assert torch.equal(pa, pb)


def _cpu_units(monkeypatch, amx: bool, avx512_bf16: bool) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16, raising=False)


def _gemm_rates(monkeypatch, bf16: float, fp32: float) -> None:
    """What the CPU's GEMMs measure, in GFLOP/s."""
    from alignflow.models import cpu_dtype

    monkeypatch.setattr(cpu_dtype, "cpu_gemm_rates", lambda: {"bfloat16": bf16, "float32": fp32})


def test_fastest_dtype_is_bf16_only_where_the_cpu_measures_it_clearly_faster(monkeypatch):
    import torch

    from alignflow.models.factory import inference_dtype, select_dtype, trl_model_init_kwargs
    from alignflow.models.model_config import ModelSpec

    fastest, auto = ModelSpec(dtype="fastest"), ModelSpec(dtype="auto")
    _cpu_units(monkeypatch, amx=False, avx512_bf16=False)  # AVX2 only: bf16 would be emulated
    _gemm_rates(monkeypatch, bf16=1e6, fp32=1.0)  # not consulted: emulated bf16 is never timed
    assert select_dtype(fastest) == torch.float32 and inference_dtype(fastest) == torch.float32
    assert trl_model_init_kwargs(fastest)["dtype"] == "float32"
    _cpu_units(monkeypatch, amx=False, avx512_bf16=True)
    _gemm_rates(monkeypatch, bf16=379.0, fp32=220.0)  # a Zen 4: native bf16 dot products
    assert select_dtype(fastest) == torch.bfloat16 and trl_model_init_kwargs(fastest)["dtype"] == "bfloat16"
    _gemm_rates(monkeypatch, bf16=165.0, fp32=315.0)  # a Xeon whose flag is there, its speed not
    assert select_dtype(fastest) == torch.float32 and inference_dtype(fastest) == torch.float32
    _gemm_rates(monkeypatch, bf16=330.0, fp32=300.0)  # a near tie keeps fp32's precision
    assert select_dtype(fastest) == torch.float32
    _cpu_units(monkeypatch, amx=True, avx512_bf16=False)
    _gemm_rates(monkeypatch, bf16=2500.0, fp32=300.0)
    assert inference_dtype(fastest) == torch.bfloat16
    # 'auto' keeps fp32 on every CPU: the demo's numerics do not depend on the machine's units
    assert select_dtype(auto) == torch.float32 and inference_dtype(auto) is None


def test_gemm_rates_are_measured_on_this_cpu():
    """Both dtypes' rates come from timing real products: positive, finite, and the choice of
    'fastest' follows them on whatever CPU runs this."""
    import math

    from alignflow.models.cpu_dtype import BF16_MARGIN, cpu_bf16_units, fastest_cpu_dtype
    from alignflow.models.gemm_rate import peak_gflops

    rates = {
        dtype: peak_gflops(str(dtype).removeprefix("torch."), "cpu")
        for dtype in (torch.bfloat16, torch.float32)
    }
    assert all(math.isfinite(r) and r > 0 for r in rates.values()), rates
    chosen = fastest_cpu_dtype()
    if not cpu_bf16_units():
        assert chosen == torch.float32
    elif chosen == torch.bfloat16:  # the same probe the choice read
        assert rates[torch.bfloat16] > rates[torch.float32] / BF16_MARGIN, rates


def test_a_reward_backbone_of_its_own_trains_fp32_weights_under_half_precision_autocast(monkeypatch):
    """On a GPU 'auto' would load the weights in bf16 (or fp16), and AdamW would update them there
    (small updates round away; fp16 gradients cannot be unscaled): the weights stay fp32 and only
    the products run in the GPU's half type."""
    from alignflow.config import load_config
    from alignflow.models.factory import model_init_kwargs, whole_model_precision_flags
    from alignflow.training.reward import backbone_spec

    config = load_config(None, ["reward.backbone=minilm", "model.dtype=auto"])
    spec = backbone_spec(config)
    for bf16 in (True, False):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda bf16=bf16: bf16)
        assert model_init_kwargs(spec)["dtype"] == torch.float32
        assert whole_model_precision_flags(spec, config.model) == {"bf16": bf16, "fp16": not bf16}
    _cpu_units(monkeypatch, amx=False, avx512_bf16=False)
    assert model_init_kwargs(spec)["dtype"] == torch.float32
    assert whole_model_precision_flags(spec, config.model) == {"bf16": False, "fp16": False}
    shared = backbone_spec(load_config(None, ["reward.backbone=policy", "model.dtype=bfloat16"]))
    assert model_init_kwargs(shared)["dtype"] == torch.bfloat16, "the policy's backbone keeps the run's dtype"
