"""`lkv collect` with the real SmolLM2-135M-Instruct on two short built-in prompts, then reading it back."""

import json
import subprocess
import sys

import pytest
import torch
from helpers import smollm2_folder

from lkvcli.targets import TargetsReader

pytestmark = pytest.mark.integration


def test_collect_real_model_two_builtin_prompts(tmp_path):
    smollm2_folder()  # converted once into $LKV_HOME
    out = tmp_path / "targets"
    cmd = [sys.executable, "-m", "lkvcli", "--json", "collect", "--data",
           "builtin:n=2,min_tokens=200,max_tokens=300,tasks=needle+summarise", "--out", str(out),
           "--max-new-tokens", "24", "--device", "cpu"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["written"] == 2

    reader = TargetsReader(out)
    assert len(reader) == 2 and reader.manifest["num_layers"] == 30 and reader.manifest["num_kv_heads"] == 3
    tasks = set()
    for rec in reader:
        tasks.add(rec.meta["task"])
        assert 200 <= rec.prompt_len <= 400  # user text 200-300 tokens plus the chat template
        assert rec.target.shape == (30, 3, rec.prompt_len)
        assert torch.allclose(rec.target.sum(-1), torch.ones(30, 3), atol=1e-4)
        assert 0 < rec.response_ids.numel() <= 24 and rec.meta["response_text"].strip()
    assert tasks == {"needle", "summarise"}

    again = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0 and json.loads(again.stdout)["already_done"] == 2
