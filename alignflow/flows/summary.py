"""What a pipeline run reports back: small, JSON-serialisable, rendered by the CLI."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from alignflow.evaluation import metric_names as names
from alignflow.evaluation.cost import totals

# metric names that say how a trainer ran, not how good its model is: its timings (HF's
# ``model_preparation_time``, the DPO reference pass's ``reference/*_seconds`` and cache hits)
_NOISE = (
    "runtime",
    "per_second",
    "epoch",
    "before_",
    "total_flos",
    "step",
    "preparation_time",
    "_seconds",
    "_cached",
)

# what a person checks first in each stage's row; other metrics fill the rest of the cell
_HEADLINE = {
    "evaluate": (
        names.TASK_ACCURACY,
        names.REFERENCE_TASK_ACCURACY,
        names.RL_GAIN,
        names.CHAMPION_TASK_ACCURACY,
        names.REWARD_ACCURACY,
        names.TASK_ACCURACY_EVAL,
        names.KL_TO_REFERENCE,
        names.LOOP_RATE,
        names.REFERENCE_LOOP_RATE,
    ),
    "reward": (
        names.REWARD_STAGE_ACCURACY,
        names.REWARD_STAGE_ECE,
        names.REWARD_STAGE_MARGIN,
        names.REWARD_STAGE_TRAIN_ACCURACY,
    ),
    # a DPO-family policy: its held-out loss, how far chosen beats rejected, and how often
    "policy": (
        names.eval_key("loss"),
        names.eval_key("rewards/margins"),
        names.eval_key("rewards/accuracies"),
        "train_loss",
    ),
    "sft": (names.eval_key("loss"), "train_loss"),
}


def key_metrics(stage: str, metrics: dict[str, Any], limit: int = 4) -> str:
    """A stage's metrics in one short line: its headline figures first, trainer noise left out.

    Held-out figures go by their bare name, pinned-set ones as ``pinned …``; any other scope
    stays (train accuracy is not accuracy). Interval bounds are left to the gate table.
    """
    from alignflow.evaluation.intervals import is_bound_key

    headline = [k for k in _HEADLINE.get(stage, ()) if metrics.get(k) is not None]
    rest = [
        k for k in metrics if k not in headline and not any(n in k for n in _NOISE) and not is_bound_key(k)
    ]
    shown = (headline + rest)[: max(limit, len(headline))]
    return ", ".join(f"{_short(k)}={_figure(metrics[k])}" for k in shown)


def _figure(value: Any) -> str:
    """A count as an integer (``data/train=2030``), any other figure to 3 significant digits."""
    number = float(value)
    if number.is_integer() and abs(number) < 1e15:
        return str(int(number))
    return f"{number:.3g}"


def _short(key: str) -> str:
    golden, held_out = f"{names.GOLDEN}/", f"{names.EVAL}/"
    return "pinned " + key.removeprefix(golden) if key.startswith(golden) else key.removeprefix(held_out)


@dataclass
class StageOutcome:
    name: str
    seconds: float
    compute_seconds: float
    cached: bool
    metrics: dict[str, float] = field(default_factory=dict)
    output: dict[str, Any] = field(default_factory=dict)
    run_id: str | None = None  # the MLflow stage run that produced the result (an earlier one on a hit)
    cost: dict[str, float] = field(default_factory=dict)  # cost/* this run spent on it (none on a hit)


@dataclass
class RunSummary:
    project: str
    data_version: str | None = None
    config_hash: str | None = None
    parent_run_id: str | None = None
    flow_run_id: str | None = None  # the Prefect flow run (None when no flow ran)
    tracking_uri: str | None = None
    stages: list[StageOutcome] = field(default_factory=list)
    promotions: dict[str, dict[str, Any]] = field(default_factory=dict)
    nothing_to_do: str | None = None
    stopped: dict[str, Any] | None = None  # {"reason", "message", "report"} when a check stopped the run
    golden: dict[str, Any] | None = None  # the pinned evaluation set: path, version (md5), counts
    rl_stage: str | None = None  # what the RL stage added over the model it started from, in words
    random_weights: str | None = None  # model.weights: random: what the chain started from, in words
    wall_seconds: float = 0.0
    # from the command that asked for the run to the flow's first line: starting Prefect's API
    # (an ephemeral one migrates its database on a workspace's first run) and the flow run
    startup_seconds: float = 0.0

    def add(self, outcome: StageOutcome) -> StageOutcome:
        self.stages.append(outcome)
        return outcome

    def stage(self, name: str) -> StageOutcome | None:
        return next((s for s in self.stages if s.name == name), None)

    @property
    def outcome(self) -> str:
        """What the run came to: stopped, nothing_to_do, promoted (the policy) or not_promoted."""
        if self.stopped:
            return "stopped"
        if self.nothing_to_do:
            return "nothing_to_do"
        return "promoted" if self.promotions.get("policy", {}).get("promoted") else "not_promoted"

    @property
    def compute_seconds(self) -> float:
        return sum(s.compute_seconds for s in self.stages)

    @property
    def cost(self) -> dict[str, float]:
        """What the stages this run executed cost together (``cost/wall_seconds``, ...)."""
        return totals(s.cost for s in self.stages)

    @property
    def orchestration_overhead(self) -> float:
        """(flow wall time - stage compute time) / flow wall time."""
        if self.wall_seconds <= 0:
            return 0.0
        return max(0.0, (self.wall_seconds - self.compute_seconds) / self.wall_seconds)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["compute_seconds"] = self.compute_seconds
        data["cost"] = self.cost
        data["orchestration_overhead"] = self.orchestration_overhead
        return data
