"""Progress bars for long exports and saves: shown only on a terminal, and only once a step has run
for two seconds (so short runs, tests and logs never see one)."""
from __future__ import annotations

from tqdm.auto import tqdm

DELAY_S = 2


def progress(iterable=None, *, desc: str, unit: str, total: int | None = None, **options) -> tqdm:
    """``tqdm`` that stays silent off a terminal (``disable=None``) and for steps shorter than ``DELAY_S``."""
    return tqdm(iterable, desc=desc, unit=unit, total=total, delay=DELAY_S, disable=None, leave=False,
                dynamic_ncols=True, **options)
