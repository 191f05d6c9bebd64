"""What reaches the user's terminal: progress bars for long exports and saves (shown only on a terminal, and
only once a step has run for two seconds, so short runs, tests and logs never see one), and third-party
start-up logging kept off it: PJRT's C++ device-count lines, torchao's optional-kernel load failures and
torch's pytree deprecation notes (printed when transformers imports torchao). Command-line entry points
call ``quiet_third_party_logs`` unless asked to be verbose. Text from elsewhere (a bundle's names and versions) is
shown through ``printable``, so it cannot move the cursor, rewrite or hide lines, or reorder text."""
from __future__ import annotations

import logging
import os

from jaxlib import utils as jaxlib_utils
from tqdm.auto import tqdm

DELAY_S = 2
NOISY_LOGGERS = ("torchao", "torch.utils._pytree")


def progress(iterable=None, *, desc: str, unit: str, total: int | None = None, **options) -> tqdm:
    """``tqdm`` that stays silent off a terminal (``disable=None``) and for steps shorter than ``DELAY_S``."""
    return tqdm(iterable, desc=desc, unit=unit, total=total, delay=DELAY_S, disable=None, leave=False,
                dynamic_ncols=True, **options)


def printable(text: str) -> str:
    """``text`` with each character a terminal would act on instead of showing written as its Python escape:
    control characters (ESC sequences, BEL, carriage return, line breaks: ``\\x1b``, ``\\n``), invisible format
    characters such as bidi overrides (``\\u202e``) and the like (whatever ``str.isprintable`` refuses)."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def quiet_third_party_logs() -> None:
    """Only errors from the libraries above; a ``TF_CPP_MIN_LOG_LEVEL`` the user set is kept."""
    level = os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # C++ logging: tensorflow reads it when imported,
    jaxlib_utils.absl_set_min_log_level(int(level))            # jaxlib when loaded, so it is set there too
    for name in NOISY_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
