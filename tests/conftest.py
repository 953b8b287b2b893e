"""Test-wide settings and shared fixtures.

One torch thread (tiny models gain nothing from more, and CI machines are shared). The fixtures here are
found by every test module without an import; plain helpers are in helpers.py. Nothing optional (kvpress)
is imported at module level: test_kvpress.py runs alone in its own virtual environment.
"""

import pytest
import torch
from helpers import lkv, make_run

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory):
    """A tiny model, its targets and a 4-step training run with 2 checkpoints (helpers.make_run), built once
    per session and shared by every module that asks for it (read it, never change it)."""
    return make_run(tmp_path_factory.mktemp("trained"))


@pytest.fixture(scope="session")
def bundle(trained_run, tmp_path_factory):
    """The latest checkpoint of ``trained_run`` exported with the model check (built once per session)."""
    out = tmp_path_factory.mktemp("bundles") / "lookaheadkv-tiny"
    r = lkv("--json", "export", trained_run["run"], "--out", out)
    assert r.exit_code == 0, r.output
    return out


@pytest.fixture(scope="module")
def kv(bundle):
    """``LookaheadKV.from_pretrained(bundle)``: one per test module (a module may change its settings)."""
    from lkvcli import LookaheadKV

    return LookaheadKV.from_pretrained(bundle)


@pytest.fixture(scope="module")
def tiny_targets(tmp_path_factory):
    """12 records of 10-24 tokens with ground truth from greedy decoding of tiny llama (seed 0)."""
    from tiny_models import tiny_model, write_tiny_targets

    return write_tiny_targets(tmp_path_factory.mktemp("data") / "targets", tiny_model("llama"), n=12)
