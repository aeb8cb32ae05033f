"""The numpy array types of the whole project, defined once.

Every array the math passes around is float64, int64 or bool; these aliases say which in a
signature (``FloatArray``: ``NDArray[np.float64]``) without repeating the numpy generics.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

__all__ = ["BoolArray", "FloatArray", "IntArray"]

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]
BoolArray = NDArray[np.bool_]
