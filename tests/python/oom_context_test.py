#!/usr/bin/env python3
"""allocscope._oom_context.processing_parameter, which names the parameter
a thread was processing when PyTorch raised torch.OutOfMemoryError, from the
locals of the frames that raised it: the innermost frame holding a
parameter wins, a parameter itself before a list of them, and no frame or
no parameter gives None. Real frames, plain objects as parameters.

    python3 tests/python/run_pytest.py tests/python/oom_context_test.py
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tools", "python"))
from allocscope._oom_context import processing_parameter  # noqa: E402


class Param:
    pass


QKV, FC1, FC2, OTHER = Param(), Param(), Param(), Param()
NAMES = {id(QKV): ("layers.0.qkv", "weight"), id(FC1): ("layers.3.fc1", "weight"),
         id(FC2): ("layers.3.fc2", "bias")}


def parameter_of(obj):
    return NAMES.get(id(obj))


def frame():
    return sys._getframe(1)


def init_group(params):
    # An optimizer's state set-up: the list of the group, then each one.
    for p in params:
        if p is FC1:
            return frame()
    return None


def optimizer_step(params):
    return init_group(params)


def foreach_update(device_params, exp_avgs):
    return frame()


def test_the_innermost_frame_with_a_parameter_in_a_local_names_it():
    f = optimizer_step([QKV, FC1, FC2])
    assert processing_parameter(f, parameter_of) == ("layers.3.fc1", "weight", 1)


def test_a_frame_with_only_lists_of_parameters_names_the_first_and_counts_them():
    f = foreach_update([OTHER, FC2, QKV], [OTHER])
    assert processing_parameter(f, parameter_of) == ("layers.3.fc2", "bias", 2)


def test_callers_are_looked_into_when_the_failing_frame_holds_none():
    def op_without_parameters(x):
        return frame()

    def caller():
        p = QKV  # noqa: F841 (read through the frame)
        return op_without_parameters(3)

    assert processing_parameter(caller(), parameter_of) == ("layers.0.qkv", "weight", 1)


def test_a_list_in_a_caller_or_a_parameter_far_out_names_nothing():
    # A training loop holding every parameter says nothing of the op that
    # failed several calls further in.
    def op_without_parameters():
        return frame()

    def step():
        return op_without_parameters()

    def loop():
        params = [QKV, FC1]  # noqa: F841 (read through the frame)
        return step()

    assert processing_parameter(loop(), parameter_of) is None

    def deep(n):
        return frame() if n == 0 else deep(n - 1)

    def holder():
        p = QKV  # noqa: F841
        return deep(5)

    assert processing_parameter(holder(), parameter_of) is None


def test_no_parameter_in_any_frame_and_no_frame_give_none():
    assert processing_parameter(frame(), lambda obj: None) is None
    assert processing_parameter(None, parameter_of) is None


def test_a_lookup_that_raises_gives_none_and_never_the_error():
    def broken(obj):
        raise RuntimeError("boom")

    assert processing_parameter(optimizer_step([QKV]), broken) is None
