"""Per-thread OS priority (devices/os_priority.py): a helper thread takes a lane's nice for
its launches and gets its own back."""

from __future__ import annotations

import pytest

from av_infer.devices import os_priority

pytestmark = pytest.mark.skipif(not os_priority.supported(), reason="no per-thread nice here")


def test_as_lane_restores_the_thread_s_own_priority() -> None:
    """Where the process may raise a thread's priority back, a helper takes the lane's nice
    and returns to its own; where it may not, the cpu device never renices helpers (it
    leaves niced lanes to their workers) and says so in its stats."""
    own = os_priority.current_nice()
    if os_priority.can_restore():
        with os_priority.as_lane(min(19, own + 10)):
            assert os_priority.current_nice() == min(19, own + 10)
        assert os_priority.current_nice() == own
    from av_infer import Runtime

    with Runtime("cpu") as rt:
        dev = rt.stats()["device"]
        assert dev["helpers_reniced"] is os_priority.can_restore()
