"""One bit of one element of a tensor, flipped: the corruption a drill injects (docs/sdc.md#drills)."""

from __future__ import annotations

from typing import Any

import numpy as np

_UNSIGNED = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def flip_in_words(values: np.ndarray, element: int, bit: int) -> None:
    """Flips bit `bit` of element `element` of the flattened numpy array `values`, in its own memory."""
    words = values.reshape(-1).view(_UNSIGNED[values.itemsize])
    words[element] ^= words.dtype.type(1 << bit)


def fits(tensor: Any, element: int, bit: int) -> bool:
    """Whether the tensor has that element and its words that bit."""
    return element < int(tensor.size) and bit < int(tensor.itemsize) * 8


def flipped_copy(tensor: Any, element: int, bit: int) -> Any:
    """A new MindSpore Tensor equal to `tensor` but for the flipped bit (`tensor` itself where it has no such
    element or bit). A bfloat16's bits are the upper half of a float32's, which converts back exactly (numpy has no
    bfloat16)."""
    import mindspore as ms

    if not fits(tensor, element, bit):
        return tensor
    if "BFloat16" in str(tensor.dtype):
        values = np.array(tensor.astype(ms.float32).asnumpy(), np.float32)
        flip_in_words(values, element, bit + 16)
        return ms.Tensor(values).astype(ms.bfloat16)
    values = np.array(tensor.asnumpy())
    flip_in_words(values, element, bit)
    return ms.Tensor(values)
