"""A registered reward model served through ``mlflow.pyfunc`` scores as alignflow scores.

Users load registry models with ``mlflow.pyfunc.load_model`` (and ``mlflow models serve``);
that path must apply the model's pooling, prompt format and normalisation, or the reward a
service sees differs from the one promotion was decided on.
"""

import json
import shutil
import subprocess
import sys

import mlflow
import pandas as pd
import pytest
from mlflow import MlflowClient

from alignflow.models.reward_scorer import RewardMeta, load_reward_scorer
from alignflow.registry import models

PROMPTS = ["Human: how do I boil an egg?\n\nAssistant:", "Human: name a colour\n\nAssistant:", "Hi"]
RESPONSES = [" Put it in boiling water for eight minutes.", " Blue.", " Hello there, how can I help?"]


@pytest.fixture
def answer_pooled_reward(tmp_path, reward_model_dir):
    """The tiny classifier with what the reward stage saves beside it: answer pooling, a
    short max length and a non-trivial normalisation, so a loader that ignores them differs."""
    model_dir = tmp_path / "reward"
    shutil.copytree(reward_model_dir, model_dir)
    RewardMeta(mean=0.7, std=0.05, max_length=24, pooling="answer").save(model_dir)
    return model_dir


def _log(tmp_path, model_dir, name="demo-reward"):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    mlflow.set_tracking_uri(uri)
    experiment = MlflowClient(uri).create_experiment("t", artifact_location=(tmp_path / "art").as_uri())
    with mlflow.start_run(experiment_id=experiment):
        logged = models.log_model(model_dir, uri, name)
    return uri, logged


def test_pyfunc_rewards_match_the_scorer_on_the_saved_model(tmp_path, answer_pooled_reward):
    uri, logged = _log(tmp_path, answer_pooled_reward)
    served = mlflow.pyfunc.load_model(f"models:/{logged.name}@{models.CHALLENGER}")
    out = served.predict(pd.DataFrame({"prompt": PROMPTS, "response": RESPONSES}))

    scorer = load_reward_scorer(answer_pooled_reward)
    assert list(out.columns) == ["reward"]
    assert out["reward"].tolist() == pytest.approx(scorer(PROMPTS, RESPONSES), abs=1e-4)
    raw = served.predict(
        pd.DataFrame({"prompt": PROMPTS, "response": RESPONSES}), params={"normalize": False}
    )
    assert raw["reward"].tolist() == pytest.approx(scorer.raw(PROMPTS, RESPONSES), abs=1e-4)


def test_pyfunc_takes_chat_messages_as_json(tmp_path, answer_pooled_reward):
    uri, logged = _log(tmp_path, answer_pooled_reward)
    served = mlflow.pyfunc.load_model(logged.model_uri)
    messages = [{"role": "user", "content": "name a colour"}]
    out = served.predict(pd.DataFrame({"prompt": [json.dumps(messages)], "response": [" Blue."]}))
    assert out["reward"].tolist() == pytest.approx(
        load_reward_scorer(answer_pooled_reward)([messages], [" Blue."]), abs=1e-4
    )


def test_pyfunc_names_a_missing_column(tmp_path, answer_pooled_reward):
    uri, logged = _log(tmp_path, answer_pooled_reward)
    served = mlflow.pyfunc.load_model(logged.model_uri)
    with pytest.raises(Exception, match="response"):
        served.predict(pd.DataFrame({"prompt": PROMPTS}))


def test_the_registered_reward_model_comes_back_as_a_directory_the_scorer_loads(
    tmp_path, answer_pooled_reward
):
    uri, logged = _log(tmp_path, answer_pooled_reward)
    fetched = models.download_model_dir(uri, logged.name, models.CHALLENGER, tmp_path / "fetched")
    assert RewardMeta.load(fetched) == RewardMeta.load(answer_pooled_reward)
    again = load_reward_scorer(fetched)(PROMPTS, RESPONSES)
    assert again == pytest.approx(load_reward_scorer(answer_pooled_reward)(PROMPTS, RESPONSES), abs=1e-5)
    components = models.load_components(uri, logged.name, logged.version)
    assert components["model"].config.num_labels == 1


def test_a_fresh_process_loads_the_scorer_shipped_with_the_model(tmp_path, answer_pooled_reward):
    """``mlflow models serve`` starts a new interpreter: the alignflow code logged beside the
    weights (``code_paths``) is what it scores with."""
    uri, logged = _log(tmp_path, answer_pooled_reward)
    script = (
        "import json, sys, mlflow, pandas as pd\n"
        f"mlflow.set_tracking_uri({uri!r})\n"
        f"model = mlflow.pyfunc.load_model({logged.model_uri!r})\n"
        f"out = model.predict(pd.DataFrame({{'prompt': {PROMPTS!r}, 'response': {RESPONSES!r}}}))\n"
        "print(json.dumps({'rewards': out['reward'].tolist(), 'code': sys.modules['alignflow'].__file__}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, check=True
    )
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert "/artifacts/code/alignflow/" in result["code"]
    expected = load_reward_scorer(answer_pooled_reward)(PROMPTS, RESPONSES)
    assert result["rewards"] == pytest.approx(expected, abs=1e-4)
