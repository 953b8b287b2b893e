"""End-to-end smoke test: `lkv pipeline recipes/smollm2-135m-quick.yaml` with the real SmolLM2, then a resume."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import smollm2_folder

pytestmark = pytest.mark.integration
RECIPE = Path(__file__).resolve().parents[1] / "recipes" / "smollm2-135m-quick.yaml"


def run_pipeline(cwd):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "lkvcli", "pipeline", str(RECIPE)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=900)


def test_quick_pipeline_end_to_end_and_resume(tmp_path):
    smollm2_folder()
    done = run_pipeline(tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    out = tmp_path / ".lkv-quick"
    results = json.loads((out / "results" / "results.json").read_text())
    assert set(results["methods"]) >= {"lookahead", "snapkv"}
    bundle = json.loads((out / "bundle" / "lkv.json").read_text())
    assert bundle["num_tokens"] == 8 and bundle["base_model"]["fingerprint"]["num_layers"] == 30
    assert (out / "bundle" / "adapter_model.safetensors").is_file()
    assert (out / "run" / "checkpoints" / "latest").read_text().strip() == "step-000004"
    assert "Summary on 2 held-out prompts" in done.stdout and "recall@32" in done.stdout
    for line in ("report: .lkv-quick/results/report.md", "plots:  .lkv-quick/results/plots", "bundle: .lkv-quick/bundle"):
        assert line in done.stdout

    again = run_pipeline(tmp_path)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "10/10 already done" in again.stderr + again.stdout
