"""Cold compile vs warm start from the persistent compile cache, each in a fresh process.

Converts a golden zoo model and times its first call (compile + run) in a process
with an empty cache folder, then again in a new process that finds the entry.

    .venv/bin/python bench/warm_start.py [--model gpt2_2layer]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

from torch_stablehlo.runtime.compile_cache import DIR_VARIABLE

FIRST_CALL = """
import json, time
from torch_stablehlo.exporter import export_to_stablehlo
from torch_stablehlo.golden import zoo
from torch_stablehlo.runtime import pjrt
built = zoo.get({model!r}).build()
artifact = export_to_stablehlo(built.model, built.args, built.kwargs)
start = time.perf_counter()
artifact(*built.args, **built.kwargs)
print(json.dumps(dict(pjrt.STATS, first_call_s=time.perf_counter() - start)))
"""


def first_call(model: str, cache_dir: str) -> dict:
    env = dict(os.environ, **{DIR_VARIABLE: cache_dir})
    result = subprocess.run([sys.executable, "-c", FIRST_CALL.format(model=model)], capture_output=True,
                            text=True, env=env, check=True)
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gpt2_2layer")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as cache_dir:
        cold, warm = first_call(options.model, cache_dir), first_call(options.model, cache_dir)
    print(f"{'model':<16}{'cold first call (s)':>22}{'warm first call (s)':>22}{'ratio':>8}{'compiles (cold/warm)':>23}")
    print(f"{options.model:<16}{cold['first_call_s']:>22.3f}{warm['first_call_s']:>22.3f}"
          f"{warm['first_call_s'] / cold['first_call_s']:>8.3f}{cold['compiled']:>12}/{warm['compiled']}")


if __name__ == "__main__":
    main()
