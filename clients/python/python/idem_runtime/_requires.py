"""The message an optional module gives when its framework is not installed."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator


@contextmanager
def requires(module: str, extra: str, tested: str) -> Iterator[None]:
    """Turns the ImportError of ``module``'s framework into one that says what to install."""
    try:
        yield
    except ImportError as e:
        raise ImportError(
            f"idem_runtime.{module} needs its framework (tested with {tested}): "
            f"pip install 'idem-runtime[{extra}]'. The import failed with: {e}"
        ) from e
