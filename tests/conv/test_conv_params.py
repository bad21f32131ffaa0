"""conv/_params.py: the memoised geometry checks give the same answers and the same errors as the checks themselves."""

import numpy as np
import pytest

from tinylearn.conv._params import pool_params_nd, window_params_nd


def test_memoised_geometry_equals_the_checks_and_never_caches_an_error():
    args = ((8, 8), (3, 3), 1, 1, 1, "input")
    first = window_params_nd(*args, lead=(4, 2))
    assert window_params_nd(*args, lead=(4, 2)) is first  # served from the memo
    assert window_params_nd.__wrapped__(*args, lead=(4, 2)) == first == ((3, 3), (1, 1), (1, 1), (1, 1), (8, 8))
    # a bool where an int is expected is refused even after the int's entry exists (the key holds the types)
    with pytest.raises(TypeError, match="stride"):
        window_params_nd((8, 8), (3, 3), True, 1, 1, "input", lead=(4, 2))
    with pytest.raises(TypeError, match="padding"):
        window_params_nd((8, 8), (3, 3), 1, (True, 1), 1, "input", lead=(4, 2))
    # lists and numpy ints are checked every time and give the same geometry
    assert window_params_nd((8, 8), [3, 3], np.int64(1), 1, 1, "input", lead=(4, 2)) == first
    # an error is raised on every call, not remembered as a result
    for _ in range(2):
        with pytest.raises(ValueError, match="kernel_size"):
            window_params_nd((2, 2), (5, 5), 1, 0, 1, "input")
    pool = ((8, 8), 2, None, 0, 1, True, "x")
    assert pool_params_nd(*pool) == pool_params_nd.__wrapped__(*pool)
    assert pool_params_nd((7, 7), 2, None, 0, 1, True, "x")[4] != pool_params_nd((7, 7), 2, None, 0, 1, False, "x")[4]
