"""Every command README.md and the Makefile show, run: each ```bash line, each inline command in the text
(`make ...`, `python ...`, `torch-stablehlo ...`, `pytest ...`, `pip ...`), each Makefile target's recipe, each
bench script and each ```python block.

``plan`` says how each command runs: as written, or changed with the reason given: sizes made small (``--only
mlp``, ``bench/convert_speed.py --small``), output into the test's folder instead of the checkout
(``golden.regenerate --data-dir``, ``coverage --out``), a free port for a server, or not run here (``make test``
is this suite; ``pip install``/``pip wheel`` are what ``.ci/run`` does). A command ``plan`` does not know fails
``test_every_command_has_a_plan``, so a new command in README.md or the Makefile is run from the start. The
commands run in one folder holding the README's placeholders: ``mypkg.models:build`` (the zoo's ``mlp``, whose
forward takes ``x``), ``in.npz``; a path a command reads (``out/b``, ``divergence.json``) is written first by the
README's own command that writes it. Each Python block runs with a preamble defining what the block takes as given
(``model``, ``x``, ``art``, ``quantizer``, ...) and a check of what it made; a block without one fails.

``make test`` runs a fixed share of the commands that take seconds (``MAKE_TEST_COMMANDS``: the CLI's export ->
run -> inspect -> verify chain, its help, ``make demo`` small, ``make clean``) and the Python blocks; ``make
check-commands`` runs every one: also the other commands that take seconds and those that take longer: the bench
scripts (``make bench-large`` included), ``make coverage`` and ``make models`` at small sizes, ``make demo`` as
written, ``make test-full``'s collection, the Model Explorer server, the serving check. ``.ci/run`` runs all but
make test's share after ``make test`` (``--documented-commands slow``; see ``conftest.py``).
"""
from __future__ import annotations

import ast
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.conftest import documented_commands

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
PYTHON = sys.executable
CLI = str(Path(sys.executable).with_name("torch-stablehlo"))
ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
COMMAND_START = re.compile(r"^(make|python3?|torch-stablehlo|pytest|pip|\.venv/bin/python)(\s|$)")


# -- what README.md and the Makefile show ----------------------------------------------------------------

def fenced_blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", README, re.M | re.S)


def bash_blocks() -> list[list[str]]:
    """Each ```bash block's commands, comments left out."""
    blocks = []
    for block in fenced_blocks("bash"):
        commands = [shlex.split(line, comments=True) for line in block.splitlines()]
        blocks.append([shlex.join(words) for words in commands if words])
    return blocks


def inline_commands() -> list[str]:
    """Commands quoted in the text (outside code blocks): `make golden`, `python -m ...`, `pytest --full-sweep`."""
    prose = re.sub(r"^```.*?^```", "", README, flags=re.M | re.S)
    spans = re.findall(r"`([^`\n]+)`", prose)
    return sorted({shlex.join(shlex.split(span)) for span in spans if COMMAND_START.match(span)})


def make_targets() -> dict[str, list[str]]:
    """The Makefile's .PHONY targets -> their recipe lines, ``$(PY)`` read as ``python``."""
    text = (ROOT / "Makefile").read_text()
    phony = re.search(r"^\.PHONY:(.*)$", text, re.M)[1].split()
    recipes = {}
    for target in phony:
        match = re.search(rf"^{re.escape(target)}:[^\n]*\n((?:\t[^\n]*\n?)*)", text, re.M)
        assert match, f"Makefile: .PHONY names {target}, which has no rule"
        lines = [line.strip() for line in match[1].splitlines()]
        recipes[target] = [line.replace("$(PY)", "python").replace("$(VENV)", ".venv") for line in lines if line]
    return recipes


# -- how each is run ---------------------------------------------------------------------------------------------

@dataclass
class Run:
    """One command as run here: ``argv`` in the commands' folder (``None``: not run here, ``why`` says why)."""
    documented: str
    argv: list[str] | None
    why: str = ""
    server: bool = False  # runs until stopped: started, checked to answer HTTP, stopped
    needs: list[str] = field(default_factory=list)  # paths in the folder an earlier README command writes
    probe: str = "/"  # what a server must answer with 200


# python -m torch_stablehlo.<module> (keyed by the module's last name, so a move between packages keeps it):
# arguments that keep it small or out of the checkout
MODULE_ARGS = {
    "demo": (["--model", "mlp", "--no-llm"], "the zoo's mlp instead of GPT-2 12-layer, no LLM part"),
    "verify": (["--only", "mlp"], "one small model"),
    "dynamic": (["--only", "mlp"], "one small model"),
    "regenerate": (["--only", "mlp", "--data-dir", "golden-data"], "one model, into this folder, not golden/data"),
    "serving": (["--only", "mlp"], "one small model"),
    "model_sweep": (["--only", "gpt2", "--out", "models-report"], "one small model, into this folder, not docs"),
}
# also run as written, in CI's second step (make demo: GPT-2 12-layer and the export_generate part)
AS_WRITTEN_TOO = {"demo"}
BENCH_ARGS = {
    "convert_speed.py": ["--small"],
    "run_speed.py": ["--models", "mlp", "--repeats", "1"],
    "warm_start.py": ["--model", "mlp"],
    "unrolled_vs_scanned.py": ["--depths", "1", "2", "--repeats", "1"],
    "tensor_parallel.py": ["--devices", "2", "--repeats", "1"],
    "auto_sharding.py": ["--quick", "--repeats", "1", "--search-layers", "2"],
    "multi_gb_export.py": ["--layers", "1", "--hidden", "64", "--intermediate", "128", "--heads", "4",
                           "--vocab", "512", "--shard-gb", "0.0001"],
    "decode_speed.py": ["--small", "--repeats", "1"],
    "generate_speed.py": ["--small", "--repeats", "1"],
    "load_trust.py": ["--model", "mlp", "--repeats", "1"],
    "quantized_decode_speed.py": ["--small", "--repeats", "1", "--new-tokens", "4"],
    "serve_load.py": ["--small", "--requests", "4"],
}
# The commands make test runs (each a process of a few seconds): the CLI's export -> run -> inspect -> verify chain
# and its help, make demo at its small size, make clean. CI's second step and make check-commands run the others
# too: another spelling of a command, the other subcommands' help, the golden tools, bisect and explore (5 to 15 s
# of CPU each, about 85 s together), the bench scripts (8 to 25 s each), the serving check, the model sweep, the
# served demo, make demo as written, the IREE compile, the coverage report, the servers (a minute or more each),
# where make test has about a minute for this module's commands.
MAKE_TEST_COMMANDS = {
    "make demo: python -m torch_stablehlo.golden.demo", "make clean", "torch-stablehlo",
    "torch-stablehlo export mypkg.models:build --bundle out/b --saved-model out/tf --dynamic 'x:0=batch[1,64]'",
    "torch-stablehlo run out/b --inputs in.npz --output out.npz", "torch-stablehlo inspect out/b",
    "torch-stablehlo verify out/b --golden gpt2_2layer"}
COVERAGE_ARGS = ["--ops", "abs,nn.functional.relu", "--jobs", "1", "--out", "coverage-report"]


def plan(command: str) -> list[Run]:
    words = shlex.split(command)
    program, args = words[0], words[1:]
    if program == "make":
        if not args:
            return [Run(command, None, why="the default goal installs .venv, which every target (this suite's "
                                           "included) depends on")]
        (target,) = args
        if target == "test":
            return [Run(command, None, why="this test suite")]
        if target == "check-commands":
            return [Run(command, None, why="this test module, with --documented-commands all")]
        if target == "check-imports":
            return [Run(command, None, why=".ci/run runs it (mypy over the whole package: about 30 s of CPU, cold)")]
        if target == "clean":  # its recipe, in the test's folder holding what it removes
            return [Run(command, ["bash", "-c", "mkdir -p .venv/bin .pytest_cache && " + make_targets()["clean"][0]
                                  + " && test ! -e .venv && test ! -e .pytest_cache"],
                        why="in the test's folder, not the checkout")]
        runs = [run for line in make_targets()[target] for run in plan(line)]
        for run in runs:
            run.documented = f"{command}: {run.documented}"
        return runs
    if program in ("python", "python3", ".venv/bin/python") and args[:1] == ["-m"] and args[1] == "pytest":
        return plan(shlex.join(["pytest", *args[2:]]))
    if program == "pytest":  # make test-full, pytest --full-sweep: the full sweep collected, not run (an hour)
        assert "--full-sweep" in args, command
        return [Run(command, [PYTHON, "-m", "pytest", "--full-sweep", "--collect-only", "-q", "-p", "no:xdist",
                              str(ROOT / "tests" / "tools" / "test_opinfo_sweep.py")],
                    why="collected with every OpInfo entry, not run (most of an hour)")]
    if program in ("python", "python3", ".venv/bin/python") and args[:1] == ["-m"]:
        module = args[1]
        assert module.split(".")[0] == "torch_stablehlo", command
        if module == "torch_stablehlo":  # the CLI as a module: planned as torch-stablehlo is, run with -m
            if len(args) == 2:
                return [Run(command, None, why="tests/test_packaging.py runs `python -m torch_stablehlo --help`")]
            (run,) = plan(shlex.join(["torch-stablehlo", *args[2:]]))
            run.documented, run.argv = command, run.argv and [PYTHON, "-m", module, *run.argv[1:]]
            return [run]
        name = module.split(".")[-1]
        if name == "export_tests":
            return [Run(command, None, why="reads PyTorch's test/export/test_export.py, which is not in the torch "
                                           "wheel (a measurement outside the suite; tools/conformance.py is tested by "
                                           "tests/conformance)")]
        extra, why = MODULE_ARGS.get(name, ([], ""))
        small = Run(command, [PYTHON, "-m", module, *args[2:], *extra], why=why)
        return [small] + ([Run(f"{command} (as written)", [PYTHON, "-m", module, *args[2:]], why="as written")]
                          if name in AS_WRITTEN_TOO else [])
    if program in ("python", "python3", ".venv/bin/python") and args and args[0].startswith("bench/"):
        script = args[0].split("/")[-1]
        assert script in BENCH_ARGS, f"{command}: no small size known for {script}"
        small = BENCH_ARGS[script]
        kept = [word for i, word in enumerate(args[1:]) if word not in small and (i == 0 or args[i] not in small)]
        return [Run(command, [PYTHON, str(ROOT / args[0]), *kept, *small],
                    why="small sizes (options the small size sets replace the documented ones)")]
    if program == "torch-stablehlo":
        return [cli(command, args)]
    if program == "pip" and args[:1] in (["install"], ["wheel"]):
        return [Run(command, None, why=".ci/run: builds the wheel, installs it into a fresh venv (-c constraints.txt) "
                                   "and smoke-tests it; make installs .venv with the same pip command")]
    raise AssertionError(f"no plan for the documented command {command!r}: say in {__file__} how to run it")


def cli(command: str, args: list[str]) -> Run:
    if not args:
        return Run(command, [CLI, "--help"], why="no command given: the help")
    subcommand = args[0]
    if len(args) == 1 and subcommand in ("export", "run", "verify", "inspect", "explore", "iree", "serve"):
        return Run(command, [CLI, subcommand, "--help"], why="named in the text without its arguments: its help")
    reads = {"run": [args[1:2], args[args.index("--inputs") + 1:][:1] if "--inputs" in args else []],
             "verify": [args[1:2]], "inspect": [args[1:2]], "iree": [args[1:2]],
             "explore": [args[1:2], args[args.index("--divergence") + 1:][:1] if "--divergence" in args else []]}
    needs = [path for group in reads.get(subcommand, []) for path in group]
    if subcommand == "iree":
        return Run(command, [CLI, *args], needs=needs,
                   why="an IREE compile of the small GPT-2 (about 30 s of CPU): CI's second step")
    if subcommand == "coverage":
        return Run(command, [CLI, *args, *COVERAGE_ARGS], why="two OpInfo entries, into this folder")
    if subcommand == "verify" and args[args.index("--golden") + 1] != "mlp":
        golden = args.index("--golden") + 1
        return Run(command, [CLI, *args[:golden], "mlp", *args[golden + 1:]], needs=needs,
                   why="out/b holds the zoo's mlp here (mypkg.models:build)")
    if subcommand == "explore" and "--out" not in args:
        return Run(command, [CLI, *args, "--port", "PORT"], server=True, needs=needs,
                   why="a free port; the server is stopped once it answers")
    if subcommand == "serve" and "--ray" in args:
        return Run(command, None, why="Ray binds the machine's interface address: tests/serving/test_ray_serve.py "
                                      "runs this inside a network namespace of its own")
    if subcommand == "serve":
        port = args.index("--port") + 1
        return Run(command, [CLI, *args[:port], "PORT", *args[port + 1:], "--cache-dir", "engines"],
                   server=True, needs=[args[1]], probe="/health",
                   why="a free port, the engine cache in this folder; stopped once /health answers")
    return Run(command, [CLI, *args], needs=needs)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# -- the README's world: its placeholders, and who writes what a command reads -----------------------------------

MYPKG = '''
"""README's `mypkg.models:build` (the zoo's mlp: forward(x)) and a small GPT-2 with dims named batch and seq."""
import torch

from torch_stablehlo.golden import zoo


def build():
    built = zoo.get("mlp").build()
    return built.model, built.args


def gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=128, use_cache=False)).eval()
    return model, (torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(0)),)
'''
WRITERS = {  # a path a command reads -> the README command that writes it (run first where it is missing)
    "out/b": "torch-stablehlo export mypkg.models:build --bundle out/b --saved-model out/tf --dynamic "
             "'x:0=batch[1,64]'",
    "divergence.json": "torch-stablehlo verify out/b --golden mlp --bisect --bisect-report divergence.json",
}
MADE_HERE = {  # paths README's commands read that no README command writes: made here, as a user would
    "out/gpt2": [CLI, "export", "mypkg.models:gpt2", "--bundle", "out/gpt2", "--dynamic", "input_ids:0=batch[1,8]",
                 "--dynamic", "input_ids:1=seq[2,32]"],
    "out/llama-checkpoint": [PYTHON, str(ROOT / "tests" / "serving" / "server_support.py"), "out/llama-checkpoint"],
}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """The commands' folder: README's placeholders (``mypkg``, ``in.npz``: 3 rows of the mlp's input ``x``)."""
    import numpy as np

    from torch_stablehlo.golden import zoo

    folder = tmp_path_factory.mktemp("readme")
    (folder / "mypkg").mkdir()
    (folder / "mypkg" / "__init__.py").write_text("")
    (folder / "mypkg" / "models.py").write_text(MYPKG)
    np.savez(folder / "in.npz", x=zoo.get("mlp").build().args[0].numpy()[:3])
    return folder


def execute(run: Run, folder: Path) -> str:
    for path in run.needs:
        if not (folder / path).exists():
            if path in WRITERS:
                for prior in plan(WRITERS[path]):
                    execute(prior, folder)
            else:
                checked(MADE_HERE[path], folder, f"making {path}")
    if run.server:
        return serve(run, folder)
    return checked(run.argv, folder, run.documented)


def checked(argv: list[str], folder: Path, documented: str) -> str:
    started = time.perf_counter()
    result = subprocess.run(argv, cwd=folder, env=ENV, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, (f"`{documented}` (run as `{shlex.join(argv)}`) exited {result.returncode} "
                                    f"after {time.perf_counter() - started:.1f} s:\n{result.stdout[-2000:]}\n"
                                    f"{result.stderr[-4000:]}")
    return result.stdout


def serve(run: Run, folder: Path) -> str:
    port = str(free_port())
    argv = [port if word == "PORT" else word for word in run.argv]
    log = folder / f"server-{port}.log"
    with log.open("w") as output:
        process = subprocess.Popen(argv, cwd=folder, env=ENV, stdout=output, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            assert process.poll() is None, f"`{run.documented}` exited {process.returncode}:\n{log.read_text()}"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}{run.probe}", timeout=5) as response:
                    assert response.status == 200
                    return ""
            except OSError:
                time.sleep(1)
        raise AssertionError(f"`{run.documented}`: nothing answered on 127.0.0.1:{port} in 300 s")
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


# -- the tests ----------------------------------------------------------------------------------------------------

def documented() -> list[str]:
    """Every command shown: README's ```bash lines and inline commands, ``make TARGET`` for each target, and each
    bench script (README's table lists them all; not every one is in a command)."""
    return ([c for block in bash_blocks() for c in block] + inline_commands() + [f"make {t}" for t in make_targets()]
            + [f"python bench/{path.name}" for path in sorted((ROOT / "bench").glob("*.py"))])


def runs() -> list[Run]:
    """Each distinct command line to run once (``make golden`` and README's ``python -m ...regenerate`` are one);
    ``MAKE_TEST_COMMANDS`` says which ``make test`` runs."""
    unique: dict[tuple, Run] = {}
    for command in documented():
        for run in plan(command):
            key = tuple(run.argv) if run.argv else (run.documented,)
            unique.setdefault(key, run)
    return list(unique.values())


def pytest_generate_tests(metafunc):
    if "run" in metafunc.fixturenames:
        mode = documented_commands(metafunc.config)
        chosen = [r for r in runs()
                  if r.argv is not None and (mode == "all" or (r.documented in MAKE_TEST_COMMANDS) == (mode == "fast"))]
        metafunc.parametrize("run", chosen, ids=[r.documented[:100] for r in chosen])


def test_readme_and_makefile_show_commands():
    assert len(bash_blocks()) >= 4 and "make demo" in bash_blocks()[0] and inline_commands()
    assert {"demo", "test", "bench", "bench-large", "coverage", "golden"} <= set(make_targets())


def test_every_command_has_a_plan():
    """Planning raises for a command it does not know: every README command and Makefile target is known."""
    unplanned = []
    for command in documented():
        try:
            plan(command)
        except (AssertionError, KeyError, ValueError, IndexError) as error:
            unplanned.append(f"{command}: {error}")
    assert not unplanned, "\n".join(unplanned)
    assert len(runs()) >= 25
    runnable = {run.documented for run in runs() if run.argv is not None}
    assert MAKE_TEST_COMMANDS <= runnable, "MAKE_TEST_COMMANDS names a command README no longer shows, or one not run"
    assert set(WRITERS.values()) <= set(documented()), "a WRITERS command is no longer one README shows"


def test_documented_command(run, world):
    execute(run, world)


# -- the Python blocks -----------------------------------------------------------------------------------------

# a distinctive line of the block -> (preamble: what the block takes as given, check: what it must have made);
# ``_last`` is the value of the block's last line when that is an expression
PYTHON_BLOCKS = {
    "@exporter.lowering(torch.ops.mylib.scaled_rms.default)": ("", """
        torch.testing.assert_close(art(x), model(x), rtol=1e-5, atol=1e-5)
        text = art.stablehlo_text
        assert "func.func private @jax_user_mylib_scaled_rms_default_" in text
        assert 'stablehlo.composite "mylib.mlp"' in text and 'act = "gelu_tanh", width = 32 : i64' in text
        assert 'stablehlo.composite "mylib.swiglu"' in text
        assert art.platforms == ("cpu", "cuda") and '{jax.global_constant = "_platform_index"}' in text
    """),
    "art = exporter.export_generate(model, input_ids": ("""
        import types
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM

        torch.manual_seed(0)
        model = LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                             num_attention_heads=4, num_key_value_heads=2, vocab_size=64)).eval()
        tokenizer = types.SimpleNamespace(eos_token_id=2)  # a tokenizer's only field the block reads
        input_ids = torch.tensor([[0, 0, 5, 9, 11], [7, 3, 5, 9, 11]])
        attention_mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    """, """
        assert (Path("out/llm") / "manifest.json").is_file() and (Path("out/llm_tf") / "saved_model.pb").is_file()
        with torch.no_grad():
            expected = model.generate(input_ids, attention_mask=attention_mask, max_new_tokens=64, do_sample=False,
                                      cache_implementation="static", pad_token_id=0)
        assert tokens[:, :expected.shape[1]].tolist() == expected.tolist()
    """),
    "art = export_to_stablehlo(model, (x,))     # nn.Module": ("", """
        torch.testing.assert_close(_last, model(x))
        assert (Path("out/mlp") / "manifest.json").is_file()
    """),
    'art.save("out/gpt2", target_version="week12"': ("""
        import torch
        from torch_stablehlo import export_to_stablehlo
        from mypkg.models import gpt2
        model, (input_ids,) = gpt2()
        batch, seq = torch.export.Dim("batch", min=1, max=8), torch.export.Dim("seq", min=2, max=32)
        art = export_to_stablehlo(model, (input_ids,), dynamic_shapes=({0: batch, 1: seq},))
    """, """
        assert (Path("out/gpt2") / "manifest.json").is_file() and (Path("out/gpt2_tf") / "saved_model.pb").is_file()
        import numpy as np
        logits = torch.from_numpy(np.asarray(jax_model(input_ids.numpy()).logits))
        torch.testing.assert_close(logits, model(input_ids).logits, atol=1e-4, rtol=1e-4)
    """),
    'with torch.device("meta"):': ("""
        import torch
        from safetensors.torch import save_file
        from torch_stablehlo import export_to_stablehlo, load_artifact

        class MyModel(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = torch.nn.Linear(8, 4)

            def forward(self, x):
                return torch.relu(self.fc(x))

        x = torch.randn(2, 8)
        trained = MyModel().eval()
        save_file(trained.state_dict(), "model.safetensors")
    """, """
        assert json.loads(Path("out/b/manifest.json").read_text())["weights"]
        torch.testing.assert_close(run(x), trained(x))
    """),
    "vmfb = compile_for_iree(art)": ("""
        import iree.runtime
        import torch
        from torch_stablehlo import export_to_stablehlo

        class Tokens(torch.nn.Module):  # elementwise: IREE lowers it with both dims dynamic
            def __init__(self):
                super().__init__()
                self.scale, self.shift = torch.nn.Parameter(torch.randn(8)), torch.nn.Parameter(torch.randn(8))

            def forward(self, x):
                return torch.nn.functional.gelu(x * self.scale + self.shift)

        model = Tokens().eval()
        dims = {0: torch.export.Dim("batch", max=64), 1: torch.export.Dim("seq", max=64)}
        art = export_to_stablehlo(model, (torch.randn(2, 8, 8),), dynamic_shapes=(dims,))
        inputs = [torch.randn(4, 16, 8)]
    """, """
        torch.testing.assert_close(torch.as_tensor(_last.to_host()), model(*inputs), atol=1e-5, rtol=1e-5)
    """),
    "torch.cond(x.sum() > 0, branch_a, branch_b, (x,))": ("""
        import torch
        from torch._higher_order_ops.map import map
        from torch._higher_order_ops.scan import scan
        from torch._higher_order_ops.while_loop import while_loop

        x, xs, y, h0, mask = torch.randn(4, 8), torch.randn(5, 8), torch.randn(8), torch.zeros(8), torch.ones(4, 8)
        counter = torch.tensor(0)
        branch_a, branch_b = (lambda x: x.sin()), (lambda x: x.cos())
        cond_fn, body_fn = (lambda i, x: i < 3), (lambda i, x: (i + 1, x * 2))
        step = lambda h, x: (h + x, h.clone())
        fn = lambda x, y: x + y

        class Block(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = torch.nn.Linear(8, 8)

            def forward(self, x, mask):
                return x + torch.tanh(self.fc(x)) * mask

        class Decoder(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.blocks = torch.nn.ModuleList(Block() for _ in range(3))

        self = Decoder()
        expected = x
        for block in self.blocks:
            expected = block(expected, mask)
    """, """
        torch.testing.assert_close(x, expected)
    """),
    'mesh={"data": 2, "model": 4}': ("""
        import torch
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel
        from torch_stablehlo import export_to_stablehlo, exporter

        class Attention(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.q_proj, self.o_proj = torch.nn.Linear(16, 16), torch.nn.Linear(16, 16)

        class Model(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.embed = torch.nn.Embedding(32, 16)
                self.layers = torch.nn.ModuleList([Attention()])

            def forward(self, input_ids):
                h = self.embed(input_ids)
                return self.layers[0].o_proj(torch.relu(self.layers[0].q_proj(h)))

        model = Model().eval()
        input_ids = torch.randint(0, 32, (4, 8))
        h = torch.randn(4, 8, 16)
    """, """
        torch.testing.assert_close(art(input_ids), model(input_ids), atol=1e-5, rtol=1e-5)
        assert art.signature.mesh is not None
    """),
    'shardings="auto"': ("""
        import os, tempfile
        import torch
        from torch_stablehlo import export_to_stablehlo, exporter
        from torch_stablehlo.runtime.device_costs import costs_key

        # stated prices instead of measured ones (a second, not the measurement's ten): cheap collectives
        line = {"latency": 2e-5, "per_byte": 1e-9}
        costs = Path(tempfile.mkdtemp()) / "costs.json"
        costs.write_text(json.dumps({costs_key({"model": 4}): {"flops": 1e10, "memory": 1e10,
                                     "all_reduce": {"model": line}, "all_gather": {"model": line}}}))
        os.environ["TORCH_STABLEHLO_DEVICE_COSTS"] = str(costs)
        model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.GELU(), torch.nn.Linear(2048, 512)).eval()
        x = torch.randn(3, 512)
    """, """
        torch.testing.assert_close(art(x), model(x), atol=1e-4, rtol=1e-4)
        chosen = art.sharding_plan
        final = chosen.confirmed or chosen.timings  # the close candidates' calls after more calls
        assert "searched" in chosen.timings and chosen.cost == final[chosen.chosen] <= 1.05 * min(final.values())
        assert dict(plan) == {"0.weight": ("model",), "0.bias": ("model",), "2.weight": (None, "model"),
                              "2.bias": (), "input": ()}  # the integer program's optimum at those prices
        assert plan.total_device_bytes <= 2**22 and plan.cost > 0 and fsdp["0.weight"] == ("fsdp",)
    """),
    "prepared = prepare_pt2e(": ("""
        import torch
        from torchao.quantization.pt2e.quantizer import x86_inductor_quantizer as x86
        from torch_stablehlo import export_to_stablehlo

        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).eval()
        x = torch.randn(2, 8)
        quantizer = x86.X86InductorQuantizer().set_global(x86.get_default_x86_inductor_quantization_config())
    """, """
        assert "!quant.uniform" in art.stablehlo_text
        assert (art(x) - model(x)).abs().max() < 0.1
    """),
    "report = find_divergence(model, (x,))": ("""
        import torch
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4)).eval()
        x = torch.randn(4, 8)
    """, """
        assert report is None
    """),
    "art = exporter.export_engine(model, slots=8": ("""
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM

        torch.manual_seed(0)
        model = LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                             num_attention_heads=4, num_key_value_heads=2, vocab_size=64)).eval()
        prompt_ids = [5, 9, 11, 3]
    """, """
        expected = model.generate(torch.tensor([prompt_ids]), max_new_tokens=16, do_sample=False)[0, 4:].tolist()
        assert tokens == expected and request.finish_reason in ("stop", "length"), (tokens, expected)
    """),
    'client = OpenAI(base_url="http://127.0.0.1:8000/v1"': (f"""
        import sys
        sys.path.insert(0, {str(ROOT)!r})
        import openai
        from tests.serving.server_support import (GreedyHFEngineDouble, reference_tokens, running, tiny_llama,
                                                  train_tokenizer)
        from torch_stablehlo.serving.openai_api import build_app

        # the app over a test double of the Engine (HF greedy decoding: the client call is what the block shows)
        tokenizer = train_tokenizer()
        model = tiny_llama(len(tokenizer), tokenizer.eos_token_id)
        engine = GreedyHFEngineDouble(model).__enter__()
        server = running(build_app(engine, tokenizer, "llama-checkpoint"))
        url = server.__enter__()

        class HereOpenAI(openai.OpenAI):  # the block names port 8000; the server here took a free one
            def __init__(self, *, base_url, **options):
                super().__init__(base_url=base_url.replace("http://127.0.0.1:8000", url), **options)

        openai.OpenAI = HereOpenAI
    """, """
        from torch_stablehlo.serving.text import decode
        ids = tokenizer("The quick brown fox")["input_ids"]
        assert completion.choices[0].text == decode(tokenizer, reference_tokens(model, ids, 16))
        server.__exit__(None, None, None)
        engine.__exit__(None, None, None)
    """),
}

RUN_BLOCKS = '''
import contextlib, io, json, sys, traceback
import jax
jax.config.update("jax_num_cpu_devices", 8)  # the sharding block's mesh; before the client starts
import torch
from pathlib import Path
results = []
for source in json.load(sys.stdin):
    torch.manual_seed(0)
    namespace = {"json": json, "Path": Path}
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            exec(compile(source, "<README block>", "exec"), namespace)
        results.append(None)
    except BaseException:
        results.append(traceback.format_exc())
print(json.dumps(results))
'''


def python_blocks() -> list[str]:
    return fenced_blocks("python")


def block_key(block: str) -> str:
    keys = [key for key in PYTHON_BLOCKS if key in block]
    assert len(keys) == 1, f"README's python block has {len(keys)} entries in PYTHON_BLOCKS (needs one):\n{block}"
    return keys[0]


def runnable(block: str) -> str:
    """The preamble, the block (its last line, if an expression, kept as ``_last``) and the check."""
    preamble, check = PYTHON_BLOCKS[block_key(block)]
    tree = ast.parse(block)
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        tree.body[-1] = ast.Assign(targets=[ast.Name("_last", ast.Store())], value=tree.body[-1].value)
        ast.fix_missing_locations(tree)
    return "\n".join([textwrap.dedent(preamble), ast.unparse(tree), textwrap.dedent(check)])


def test_every_python_block_has_a_preamble():
    blocks = python_blocks()
    assert len(blocks) >= 8
    keys = [block_key(block) for block in blocks]
    assert sorted(keys) == sorted(PYTHON_BLOCKS), "PYTHON_BLOCKS has entries for blocks README no longer shows"


@pytest.mark.fast_commands_only  # make test runs them; CI's second step, the slow commands only, leaves them out
def test_readme_python_blocks(world):
    """Every Python block, in one process (one import of torch, JAX, TF for all), each in a namespace of its own,
    in a folder of its own."""
    folder = world / "python"
    folder.mkdir()
    shutil.copytree(world / "mypkg", folder / "mypkg")
    blocks = python_blocks()
    result = subprocess.run([PYTHON, "-c", RUN_BLOCKS], input=json.dumps([runnable(b) for b in blocks]), cwd=folder,
                            env=ENV, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    failed = [f"README's python block:\n{block}\nfailed:\n{error}"
              for block, error in zip(blocks, json.loads(result.stdout.strip().splitlines()[-1])) if error]
    assert not failed, "\n\n".join(failed)
