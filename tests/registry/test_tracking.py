import mlflow

from alignflow.registry import tracking


def test_logging_without_a_run_is_a_no_op():
    assert mlflow.active_run() is None
    tracking.log_metrics({"train/loss": 1.0})
    tracking.log_params({"a": 1})


def test_names_are_sanitised_and_long_params_truncated(tmp_path):
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/mlflow.db")
    with mlflow.start_run() as run:
        tracking.log_metrics({"train/loss (avg)": 0.5, "bad": float("nan"), "flag": True}, step=1)
        tracking.log_params({"sft": {"prompt": "x" * 10_000}})
    data = mlflow.get_run(run.info.run_id).data
    assert data.metrics == {"train/loss _avg_": 0.5}
    assert len(data.params["sft.prompt"]) == tracking.MAX_PARAM_VALUE
    assert data.params["sft.prompt"].endswith(tracking.TRUNCATED), "a cut value says it was cut"
