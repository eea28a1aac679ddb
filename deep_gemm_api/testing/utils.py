"""DeepGEMM's test helpers (``deep_gemm.testing``): the GPU's architecture and test filters."""

from __future__ import annotations

import functools
import os
from typing import Callable

import torch


def get_arch_major() -> int:
    return torch.cuda.get_device_capability()[0]


def test_filter(condition: Callable[[], bool]):
    """Run the decorated test only when ``condition()`` holds; say so when it does not."""

    def decorator(func):
        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            if condition():
                return func(*args, **kwargs)
            print(f"{func.__name__}:\n > Filtered by {condition}\n")
            return None

        return wrapper

    return decorator


def ignore_env(name: str, condition: Callable[[], bool]):
    """Run the decorated test without environment variable ``name`` when ``condition()`` holds."""

    def decorator(func):
        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            if not condition():
                return func(*args, **kwargs)
            saved = os.environ.pop(name, None)
            try:
                return func(*args, **kwargs)
            finally:
                if saved is not None:
                    os.environ[name] = saved

        return wrapper

    return decorator


__all__ = ["get_arch_major", "ignore_env", "test_filter"]
