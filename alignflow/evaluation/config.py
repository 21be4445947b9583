"""Typed configuration of the evaluation stage."""

from __future__ import annotations

from typing import Literal, TypedDict

from pydantic import BaseModel, ConfigDict, Field

# metadata fields that declare a slice of the pinned set (evaluation.slices), where present
DEFAULT_SLICE_FIELDS = ("slice", "problem_id", "subset", "category")


class Decoding(TypedDict):
    """An evaluation's decoding settings, as ``generate`` takes them."""

    max_new_tokens: int
    do_sample: bool
    temperature: float


class LLMJudgeConfig(BaseModel):
    """An OpenAI-compatible chat-completions server used as a pairwise judge (vLLM, Ollama, OpenAI)."""

    model_config = ConfigDict(extra="forbid")

    base_url: str = Field(..., description="e.g. http://127.0.0.1:8000/v1")
    model: str
    api_key_env: str = Field("OPENAI_API_KEY", description="environment variable holding the key, if any")
    timeout: float = Field(30.0, gt=0.0)


def _all_judges() -> list[Literal["reward", "answer"]]:
    return ["reward", "answer"]


class EvaluationConfig(BaseModel):
    """How policies and reward models are evaluated on the held-out split."""

    model_config = ConfigDict(extra="forbid")

    max_prompts: int = Field(200, ge=1, description="unique eval prompts the policy answers")
    max_pairs: int = Field(500, ge=1, description="held-out pairs the reward model ranks")
    max_new_tokens: int = Field(16, ge=1)
    batch_size: int = Field(32, ge=1)
    do_sample: bool = Field(False, description="greedy by default: comparisons are then reproducible")
    temperature: float = Field(1.0, gt=0.0)
    kl_samples: int = Field(64, ge=0, description="sampled completions for the KL estimate; 0 = skip KL")
    reference: Literal["sft", "base"] = Field(
        "sft",
        description="what the policy is measured against (gain, win rate and KL vs reference): the SFT "
        "model it started from, or the base model the chain began with (a pretrained model's own skill)",
    )
    judges: list[Literal["reward", "answer"]] = Field(
        default_factory=_all_judges, description="judges run for win rates"
    )
    primary_judge: Literal["reward", "answer"] = Field(
        "reward", description="whose eval-split win rate is reported as eval/win_rate_vs_*"
    )
    tie_margin: float = Field(0.0, ge=0.0, description="reward gap under which the reward judge calls a tie")
    num_samples: int = Field(
        20,
        ge=0,
        description="rows of completions kept from a held-out split or a benchmark; the pinned set "
        "keeps every prompt's",
    )
    seed: int = 0
    golden: str | None = Field(
        None, description="pinned evaluation file; None = freeze the first data version's eval split"
    )
    golden_dir: str = Field("golden", description="where the frozen pinned set lives (DVC-tracked)")
    llm_judge: LLMJudgeConfig | None = Field(None, description="an LLM judge on the pinned set")
    outside_judge: str | None = Field(
        None,
        description="a judge fitted once outside every run (`alignflow eval fit-judge`), by built-in name "
        "(hh-harmless-minilm) or artefact path: its win rates and its agreement with the run's reward "
        "model on the pinned pairs are reported beside the run's judges; it never decides a promotion",
    )
    slice_fields: list[str] = Field(
        default_factory=lambda: list(DEFAULT_SLICE_FIELDS),
        description="pinned rows' metadata fields that declare a slice (beside the derived problem "
        "and phrasing slices); the promotion gates judge the challenger on every slice",
    )
    min_slice_items: int = Field(
        2, ge=1, description="a slice with fewer judged items is not judged (one item is not a slice)"
    )

    def decoding(self) -> Decoding:
        """How every completion of an evaluation is decoded: what ``generate`` is given, what the
        pinned-set figures record beside them and what a served policy defaults to."""
        return Decoding(
            max_new_tokens=self.max_new_tokens, do_sample=self.do_sample, temperature=self.temperature
        )
