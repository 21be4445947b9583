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
