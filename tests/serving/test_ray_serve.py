"""``torch-stablehlo serve CHECKPOINT --ray --replicas 2``: two Ray Serve replicas of the engine answer 8
concurrent requests token-exact (the tokenizer's decoding of HF ``generate``'s greedy tokens), and both
replicas serve. Ray binds the machine's interface address whatever it is asked, so the whole exchange runs in
a network namespace this test makes (``unshare -n``, then ``ip link set lo up``): the server and its client
(tests/serving/ray_driver.py) see only loopback. Starting Ray and two replicas takes minutes on 2 cores, past
``make test``'s budget: ``make test-full`` (``--full-sweep``) runs it."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from torch_stablehlo.serving.text import decode

from .server_support import reference_tokens, save_checkpoint, tiny_llama, train_tokenizer
from .test_server import PROMPTS

ROOT = Path(__file__).resolve().parents[2]
MAX_TOKENS, CACHE_LEN = 16, 128


@pytest.mark.full_sweep_only
def test_two_replicas_token_exact(tmp_path):
    tokenizer = train_tokenizer()
    model = tiny_llama(len(tokenizer), tokenizer.eos_token_id)
    checkpoint = save_checkpoint(tmp_path / "tiny-llama", model, tokenizer)
    job = {"checkpoint": str(checkpoint), "model": checkpoint.name, "prompts": PROMPTS, "max_tokens": MAX_TOKENS,
           "max_cache_len": CACHE_LEN, "engine_dir": str(tmp_path / "engines")}
    (tmp_path / "job.json").write_text(json.dumps(job))
    result_path = tmp_path / "result.json"
    inside = (f"ip link set lo up && exec {sys.executable} -m tests.serving.ray_driver {tmp_path / 'job.json'} "
              f"{result_path}")
    subprocess.run(["unshare", "-n", "sh", "-c", inside], check=True, timeout=600, cwd=ROOT)
    result = json.loads(result_path.read_text())
    assert "error" not in result, result["error"]
    expected = [decode(tokenizer, reference_tokens(model, tokenizer(p)["input_ids"], MAX_TOKENS)) for p in PROMPTS]
    assert result["texts"] == expected
    assert len(result["replicas"]) == 2, result["replicas"]
