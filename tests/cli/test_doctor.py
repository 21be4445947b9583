from typer.testing import CliRunner

from alignflow.cli import app
from alignflow.cli.doctor import check_mlflow, check_prefect


def test_unreachable_services_are_reported_with_a_fix(monkeypatch):
    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:9/api")
    prefect = check_prefect()
    assert not prefect.ok and "did not answer" in prefect.detail and prefect.fix
    mlflow = check_mlflow("http://127.0.0.1:9")
    assert not mlflow.ok and "mlflow/README.md" in mlflow.fix


def test_doctor_exits_nonzero_when_a_service_is_missing(monkeypatch):
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    result = CliRunner().invoke(app, ["doctor", "--set", "tracking.uri=http://127.0.0.1:9"])
    assert result.exit_code == 1
    assert "MLflow" in result.output and "missing" in result.output
    result = CliRunner().invoke(app, ["doctor"])
    assert result.exit_code == 0, result.output
