"""The engine over a tiny Llama: every request's greedy tokens equal ``generate`` on its prompt alone, whatever
runs beside it and whenever it came (3 slots for more requests, a cache short enough that the rows must shift);
eos; seeded sampling beside other requests; cancellation; each bad input; a bundle read in a fresh process;
the ``to_jax`` and SavedModel entry points driven by a small loop."""
import asyncio
import gc
import json
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch.utils._pytree as pytree

from torch_stablehlo import exporter, load_artifact
from torch_stablehlo.exporter.engine.state import Admission, Prefilled, Prompt, sampling_rows
from torch_stablehlo.serving import Engine, QueueFull, RequestError

from .engine_models import VOCAB, generated, prompts, staggered, tiny

SLOTS, CACHE, MAX_PROMPT = 3, 64, 16
LENGTHS = (5, 9, 3, 16, 12, 7)
NEW = (10, 24, 30, 6, 20, 14)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """The model (eos: a token its greedy tokens for the first prompt reach at the 5th step), the engine
    exported from it and saved, and the references."""
    asked = prompts(LENGTHS)
    eos = generated(tiny("llama"), asked[0], 8)[4]
    model = tiny("llama", eos_token_id=eos)
    path = exporter.export_engine(model, slots=SLOTS, max_cache_len=CACHE, max_prompt_len=MAX_PROMPT).save(
        tmp_path_factory.mktemp("engine") / "bundle")
    expected = [generated(model, p, n) for p, n in zip(asked, NEW)]
    return model, load_artifact(path), path, asked, expected, eos


@pytest.fixture(scope="module")
def engine(setup):
    with Engine(setup[1], max_queue=16) as running:
        yield running


def test_staggered_requests_are_token_exact_with_generate_alone(setup, engine):
    model, _, _, asked, expected, eos = setup
    before = engine.stats
    ours, requests = staggered(engine, list(zip(asked, NEW)))
    assert ours == expected
    reasons = [r.finish_reason for r in requests]
    assert "stop" in reasons and "length" in reasons, reasons  # the eos ended some, max_new_tokens others
    assert all((r == "stop") == (tokens[-1] == eos) for r, tokens in zip(reasons, ours))
    assert engine.slots_busy == 0 and engine.queue_depth == 0
    after = engine.stats  # one prefill per request, an insert per request its first token did not end
    calls = {entry: after.calls[entry] - before.calls[entry] for entry in ("prefill", "insert", "generate")}
    assert calls["prefill"] == len(asked) and calls["insert"] == sum(len(t) > 1 for t in ours), calls
    steps, busy = after.steps - before.steps, after.busy_slot_steps - before.busy_slot_steps
    assert calls["generate"] <= steps and sum(len(t) - 1 for t in ours) <= busy <= steps * SLOTS, (steps, busy)
    assert all(after.seconds[entry] > before.seconds[entry] for entry in ("prefill", "generate"))


def test_async_streams(setup, engine):
    _, _, _, asked, expected, _ = setup

    async def read(request):
        return [token async for token in request]

    async def both():
        return await asyncio.gather(*(read(engine.submit(p, max_new_tokens=n)) for p, n in zip(asked[:3], NEW)))

    assert asyncio.run(both()) == expected[:3]


def test_seeded_sampling_does_not_depend_on_its_neighbours(setup, engine):
    _, _, _, asked, expected, _ = setup
    sampled = dict(max_new_tokens=16, do_sample=True, temperature=1.5, top_k=40, top_p=0.95)
    alone = list(engine.submit(asked[1], seed=7, **sampled))
    beside = [engine.submit(asked[2], max_new_tokens=20), engine.submit(asked[1], seed=7, **sampled),
              engine.submit(asked[3], seed=8, **sampled)]
    tokens = [list(r) for r in beside]
    assert tokens[1] == alone
    assert tokens[0] == generated(setup[0], asked[2], 20)  # the greedy neighbour is unchanged too
    assert alone != list(engine.submit(asked[1], seed=8, **sampled))
    assert alone != expected[1][:16]
    # a cut to the single most likely token is greedy decoding
    assert list(engine.submit(asked[1], max_new_tokens=16, do_sample=True, top_k=1, seed=3)) == expected[1][:16]
    assert list(engine.submit(asked[1], max_new_tokens=16, do_sample=True, top_p=1e-6, seed=3)) == expected[1][:16]


def test_cancelled_requests_free_their_slots(setup, engine):
    _, _, _, asked, expected, _ = setup
    closed = engine.submit(asked[2], max_new_tokens=30)
    for i, _ in enumerate(closed):
        if i == 2:
            break  # leaving the loop closes the iterator
    dropped = engine.submit(asked[4], max_new_tokens=30)
    stream = iter(dropped)
    next(stream)
    del stream
    gc.collect()
    explicit = engine.submit(asked[5], max_new_tokens=30)
    explicit.cancel()
    assert [r.finish_reason for r in (closed, dropped, explicit)] == ["cancelled"] * 3
    ours, _ = staggered(engine, list(zip(asked, NEW)))
    assert ours == expected
    assert engine.slots_busy == 0


@pytest.mark.parametrize("prompt, options, message", [
    ([], {}, "the prompt is empty"),
    (list(range(3, 3 + MAX_PROMPT + 1)), {}, "too long: this engine takes 1 to 16"),
    ([5, VOCAB, -1], {}, f"outside the vocabulary: ids run from 0 to {VOCAB - 1}"),
    ("hello", {}, "must be a list of token ids"),
    ([5, 6], {"max_new_tokens": 0}, "max_new_tokens must be an int from 1 to 48"),
    ([5, 6], {"max_new_tokens": CACHE}, "max_new_tokens must be an int from 1 to 48"),
    ([5, 6], {"do_sample": True, "temperature": 0.0}, "temperature must be a finite number > 0 when sampling"),
    ([5, 6], {"do_sample": True, "top_k": -2}, "top_k must be a non-negative int"),
    ([5, 6], {"do_sample": True, "top_p": 1.5}, "top_p must be in (0, 1]"),
    ([5, 6], {"do_sample": True, "seed": -1}, "seed must be an int from 0"),
])
def test_bad_requests_are_refused_and_the_engine_goes_on(setup, engine, prompt, options, message):
    with pytest.raises(RequestError, match=message.replace("(", r"\(").replace(")", r"\)")):
        engine.submit(prompt, **{"max_new_tokens": 4, **options})
    assert list(engine.submit(setup[3][0], max_new_tokens=NEW[0])) == setup[4][0]


def test_a_full_queue_pushes_back(setup):
    with Engine(setup[1], max_queue=2) as engine:
        with engine._lock:  # the scheduler thread cannot take a request meanwhile
            waiting = [engine.submit([5, 6], max_new_tokens=4) for _ in range(2)]
            with pytest.raises(QueueFull, match="max_queue=2"):
                engine.submit([5, 6], max_new_tokens=4)
        assert [len(list(r)) for r in waiting] == [4, 4]


def test_bundle_serves_in_a_fresh_process(setup):
    _, _, path, asked, expected, _ = setup
    script = textwrap.dedent(f"""
        import json
        from torch_stablehlo import load_artifact
        from torch_stablehlo.serving import Engine
        with Engine(load_artifact({str(path)!r})) as engine:
            requests = [engine.submit(p, max_new_tokens=n) for p, n in {list(zip(asked[:3], NEW))!r}]
            print(json.dumps([list(r) for r in requests]))
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout.strip().splitlines()[-1]) == expected[:3]


def plain(tree):
    """The typed structures as the JAX handoff takes them: nested plain tuples of JAX arrays, in field order."""
    return tuple(plain(value) for value in tree) if isinstance(tree, tuple) else jnp.asarray(np.asarray(tree))


def bucketed(prompt: list[int], bucket: int) -> tuple[np.ndarray, np.ndarray]:
    """``prompt`` left-padded to ``bucket`` columns: (input_ids, attention_mask), each [1, bucket] int64."""
    ids = np.zeros((1, bucket), np.int64)
    ids[0, bucket - len(prompt):] = prompt
    mask = np.zeros((1, bucket), np.int64)
    mask[0, bucket - len(prompt):] = 1
    return ids, mask


def drive(config, prefill, insert, generate, asked) -> list[list[int]]:
    """Two requests side by side (8 tokens each) through the entry points given as callables: ``prefill(prompt's
    input_ids, attention_mask, max_new_tokens, sampling)`` -> (first token, caches), ``insert(Admission)``,
    ``generate(steps)`` -> [steps_per_call, slots] tokens; 7 steps made in two generate calls of 3 and 4 steps."""
    made = {}
    for slot, prompt in enumerate(asked[:2]):
        ids, mask = bucketed(prompt, config.bucket(len(prompt)))
        first_token, caches = prefill(ids, mask, np.array([8]), sampling_rows(1, VOCAB))
        made[slot] = [int(np.asarray(first_token)[0])]
        insert(Admission(np.int64(slot), ids, np.int64(len(prompt)), np.int64(8), sampling_rows(1, VOCAB),
                         Prefilled(first_token, tuple(caches))))
    for steps in (3, 4):
        tokens = np.asarray(generate(steps))
        assert tokens.shape == (config.steps_per_call, SLOTS)
        for slot in made:
            made[slot] += [int(t) for t in tokens[:steps, slot]]
    return [made[0], made[1]]


def eight_tokens(expected) -> list[list[int]]:
    return [e[:8] + [0] * (8 - len(e[:8])) for e in expected[:2]]  # the pad token (0) after a slot's eos


def test_to_jax_entry_points_driven_by_a_loop(setup):
    """prefill, insert and generate as JAX functions: two requests side by side, token-exact."""
    _, artifact, _, asked, expected, _ = setup
    models = artifact.to_jax()
    held = {}
    with jax.enable_x64(True):
        held["state"] = plain(artifact.config.empty_state())

        def prefill(ids, mask, max_new_tokens, sampling):
            return models["prefill"](plain(Prompt(ids, mask, max_new_tokens, sampling)))

        def insert(admission):
            held["state"] = models["insert"](held["state"], plain(admission))

        def generate(steps):
            held["state"], tokens = models["generate"](held["state"], np.int64(steps))
            return tokens
        assert drive(artifact.config, prefill, insert, generate, asked) == eight_tokens(expected)


@pytest.mark.full_sweep_only  # saving and loading a SavedModel of four modules takes TF many seconds
def test_saved_model_entry_points_driven_by_a_loop(setup, tmp_path):
    """The TF SavedModel's signatures (one per entry point, the state in its variables): the same tokens."""
    import tensorflow as tf

    _, artifact, _, asked, expected, _ = setup
    signatures = tf.saved_model.load(str(artifact.save_tf_saved_model(tmp_path / "tf"))).signatures
    assert sorted(signatures) == ["generate", "insert", "prefill", "shift"]

    state = len(pytree.tree_leaves(artifact.config.empty_state()))

    def named(structure, entry: str) -> dict:
        """The leaves of ``structure`` by the entry point's input names (after the state's)."""
        names = [slot.tensor.name for slot in artifact.entry_points[entry].signature.user_inputs]
        names = names if entry == "prefill" else names[state:]
        return {name: tf.constant(np.asarray(leaf)) for name, leaf in zip(names, pytree.tree_leaves(structure))}

    def prefill(ids, mask, max_new_tokens, sampling):
        served = signatures["prefill"](**named(Prompt(ids, mask, max_new_tokens, sampling), "prefill"))
        return served["first_token"], [served[f"caches.{i}"] for i in range(len(served) - 1)]

    def insert(admission):
        signatures["insert"](**named(admission, "insert"))

    def generate(steps):
        return signatures["generate"](steps=tf.constant(steps, tf.int64))["tokens"]
    assert drive(artifact.config, prefill, insert, generate, asked) == eight_tokens(expected)


def test_the_state_is_donated_to_each_call(setup):
    """Every leaf of the decode state passed to insert, generate and shift is consumed (its buffer reused for the
    new state), never kept beside a copy."""
    artifact = setup[1]
    runner = artifact.runner()
    sampling = sampling_rows(1, VOCAB)
    for call in (lambda: runner.insert(0, [5, 6, 7], 8, sampling, runner.prefill([5, 6, 7], sampling, 8)),
                 runner.generate, lambda: runner.shift(2)):
        before = list(runner._state)
        call()
        assert all(leaf.is_deleted() for leaf in before)
