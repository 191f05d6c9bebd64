"""``export_generate`` over every causal LM of ``tools/model_table.py`` (categories ``GENERATING``): each greedy
program token-exact with transformers' ``model.generate`` (static cache) for one prompt and for a left-padded batch,
or refused before anything runs, with the reason. ``tools.model_sweep`` (``make models``) writes the table into
docs/models.md beside the forward-pass table; ``tests/llm/test_generate_families.py`` checks a sample (every entry
under ``--full-sweep``).

    python -m torch_stablehlo.tools.generate_sweep [--only NAME ...]
"""
from __future__ import annotations

import argparse
import sys

import torch

from torch_stablehlo import exporter

from .model_table import MODELS, VOCAB, ModelEntry

GENERATING = ("decoder", "moe", "state-space")  # the table's categories of causal LMs
NEW_TOKENS = 8
PROMPTS = {"batch 1": (6,), "left-padded batch": (6, 3)}  # prompt lengths, left-padded to the longest
PASSED, REFUSED, FAILED = "pass", "refused", "FAIL"


def generating_models() -> list[str]:
    return [name for name, entry in MODELS.items() if entry.category in GENERATING]


def prompts(lengths: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids from 3 up, left-padded with 0 to the longest; (input_ids, attention_mask)."""
    generator = torch.Generator().manual_seed(len(lengths))
    width = max(lengths)
    ids = torch.randint(3, VOCAB, (len(lengths), width), generator=generator)
    mask = (torch.arange(width) >= width - torch.tensor(lengths).unsqueeze(1)).to(torch.int64)
    return ids.masked_fill(mask == 0, 0), mask


def sweep_generate(entry: ModelEntry) -> dict:
    """``{prompt name: {"status", "reason"?}}``: ``pass`` when our tokens are generate's, ``refused`` when
    ``export_generate`` refuses the model (NotImplementedError or ValueError, before tracing runs it), else ``FAIL``
    with the first differing row or the error."""
    model = entry.build()
    model.config.use_cache = model.generation_config.use_cache = True  # the table's configs turn it off
    model.generation_config.eos_token_id = None  # every row makes all its tokens
    model.generation_config.pad_token_id = 0
    results = {}
    for label, lengths in PROMPTS.items():
        ids, mask = prompts(lengths)
        try:
            art = exporter.export_generate(model, ids, max_new_tokens=NEW_TOKENS, attention_mask=mask)
        except (NotImplementedError, ValueError) as error:
            results[label] = {"status": REFUSED, "reason": reason(error)}
            continue
        except Exception as error:  # noqa: BLE001  (the sweep records every failure and goes on)
            results[label] = {"status": FAILED, "reason": reason(error)}
            continue
        with torch.no_grad():
            expected = model.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, do_sample=False,
                                      cache_implementation="static")
        ours = art(ids, attention_mask=mask)
        same = ours.shape == expected.shape and torch.equal(ours, expected)
        results[label] = {"status": PASSED} if same else {
            "status": FAILED, "reason": f"tokens differ: ours {ours.tolist()}, generate {expected.tolist()}"}
    return results


def reason(error: BaseException) -> str:
    """The exception's type and its first line, short enough for a table cell (both sweeps' tables)."""
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0][:300] if lines else ''}"


def markdown(results: dict[str, dict]) -> list[str]:
    """docs/models.md's section on ``export_generate``: a row per model, a column per prompt."""
    passed = sum(all(r["status"] == PASSED for r in row.values()) for row in results.values())
    refused = sum(any(r["status"] == REFUSED for r in row.values()) for row in results.values())
    lines = ["## export_generate", "",
             f"`python -m torch_stablehlo.tools.generate_sweep`: the whole greedy generate loop as one program "
             f"(`exporter.export_generate`, {NEW_TOKENS} new tokens) for each causal LM above, token-exact with "
             "`model.generate(do_sample=False, cache_implementation=\"static\")` for one prompt of 6 tokens and a "
             f"batch of 6 and 3 left-padded; **{passed} of {len(results)}** pass, {refused} refused.", "",
             "| model | " + " | ".join(PROMPTS) + " | reason |", "|---|" + "---|" * (len(PROMPTS) + 1)]
    for name, row in results.items():
        reasons = sorted({r["reason"] for r in row.values() if "reason" in r})
        cells = " | ".join(r["status"] if r["status"] != FAILED else "**FAIL**" for r in row.values())
        lines.append(f"| {name} | {cells} | {'; '.join(reasons).replace('|', chr(92) + '|')} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m torch_stablehlo.tools.generate_sweep",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", action="extend", metavar="NAME", choices=generating_models())
    options = parser.parse_args(argv)
    results = {name: sweep_generate(MODELS[name]) for name in options.only or generating_models()}
    print("\n".join(markdown(results)))
    return 0 if all(r["status"] != FAILED for row in results.values() for r in row.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
