"""``refresh --keep-pins``: adding a dependency resolves only the new packages, every pin stays."""

from __future__ import annotations

from tools import lockfile


def test_every_locked_pin_but_torch_becomes_a_constraint(tmp_path):
    lock = tmp_path / "lock.txt"
    lock.write_text(
        "# dependencies-sha256: x\nnumpy==2.4.6\ntorch==2.13.0\nPyYAML==6.0.3 ; python_version >= '3'\n",
        encoding="utf-8",
    )
    assert lockfile.kept_pins(lock) == "numpy==2.4.6\npyyaml==6.0.3\n"


def test_the_committed_lock_keeps_all_its_pins():
    pins = lockfile.read_lock().pins
    kept = lockfile.kept_pins().splitlines()
    assert len(kept) == len(pins) - 1 and "gguf==" + pins["gguf"] in kept
