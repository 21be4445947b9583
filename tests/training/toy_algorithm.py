"""A toy policy algorithm that exists only through the stage registry (no alignflow file names it).

``toy`` takes a few plain gradient steps of next-token loss on the chosen answers: enough
to be a real stage (it reads its own config section, trains, saves, reports its steps).
"""

from __future__ import annotations

from pathlib import Path

import torch
from pydantic import Field

from alignflow.data.pairing import load_pairs
from alignflow.data.snapshot import load_split
from alignflow.models.factory import load_causal_lm
from alignflow.training.registry import StageSpec
from alignflow.training.run_settings import RunSettings
from alignflow.training.stage import StageResult, begin_stage, finish_stage, resolve_start_model
from alignflow.training.stage_config import StageConfig


class ToyConfig(StageConfig):
    max_steps: int = Field(3, ge=1)
    learning_rate: float = Field(1e-4, gt=0)
    per_device_train_batch_size: int = Field(4, ge=1)


def run_toy(
    config: RunSettings, data_dir: str | Path, output_dir: str | Path, model_path=None
) -> StageResult:
    stage = config.section_as("toy", ToyConfig)
    _, output_dir = begin_stage(stage, config.seed, output_dir)
    start = resolve_start_model(config.model, load_split(data_dir, "train"), output_dir, model_path)
    model, tokenizer = load_causal_lm(start)
    pairs = load_pairs(data_dir, "train")
    optimizer = torch.optim.SGD(model.parameters(), lr=stage.learning_rate)
    losses = []
    for step in range(stage.max_steps):
        batch = pairs[step * stage.per_device_train_batch_size :][: stage.per_device_train_batch_size]
        enc = tokenizer([f"{p['prompt']} {p['chosen']}" for p in batch], return_tensors="pt", padding=True)
        loss = model(**enc, labels=enc["input_ids"].masked_fill(enc["attention_mask"] == 0, -100)).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss))
    model_dir = Path(output_dir) / "model"
    model.save_pretrained(model_dir, safe_serialization=True)
    tokenizer.save_pretrained(model_dir)
    metrics = {"global_step": float(len(losses)), "train_loss": losses[-1], "toy_lr": stage.learning_rate}
    return finish_stage("toy", output_dir, model_dir, metrics, None)


TOY = StageSpec("toy", run_toy, ToyConfig, role="policy")
