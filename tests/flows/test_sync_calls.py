"""Prefect's dual sync/async calls, as synchronous code receives them."""

import pytest

from alignflow.flows.sync_calls import resolved


def test_a_value_comes_back_as_it_is():
    value = {"model_dir": "/out/model"}
    assert resolved(value) is value


def test_a_coroutine_is_refused_and_closed_so_it_never_runs_half_awaited():
    ran = []

    async def later():
        ran.append(True)

    pending = later()
    with pytest.raises(TypeError, match="must be awaited"):
        resolved(pending)
    assert pending.cr_frame is None  # closed: nothing left to await, no "never awaited" warning
    assert ran == []
