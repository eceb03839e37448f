"""Per-thread OS priority (devices/os_priority.py): a helper thread takes a lane's nice for
its launches and gets its own back."""

from __future__ import annotations

import pytest

from av_infer.devices import os_priority

pytestmark = pytest.mark.skipif(not os_priority.supported(), reason="no per-thread nice here")


def test_as_lane_restores_the_thread_s_own_priority() -> None:
    if not os_priority.can_restore():
        pytest.skip("this process may not raise a thread's priority back (no CAP_SYS_NICE)")
    own = os_priority.current_nice()
    with os_priority.as_lane(min(19, own + 10)):
        assert os_priority.current_nice() == min(19, own + 10)
    assert os_priority.current_nice() == own
