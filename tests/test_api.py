"""The library API: ``from lkvcli import LookaheadKV``, the README snippet as written,
scores and eviction through lkv's runtime, and the fingerprint check."""

import contextlib
import fnmatch
import io
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import PROMPT, lkv, tiny_llama_folder

from lkvcli.errors import LkvError

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "README.md"
SNIPPET_BUNDLE = ".lkv-demo/bundle"  # where `make demo` writes it


def readme_snippet() -> str:
    """The first python block of the README (docs/bundle.md shows the same lines)."""
    snippet = re.search(r"```python\n(.*?)```", DOCS.read_text(), re.S).group(1)
    assert snippet in (ROOT / "docs" / "bundle.md").read_text()
    return snippet


def test_readme_snippet_runs_as_written(trained_run, tmp_path, monkeypatch):
    from lkvcli.export import USAGE

    snippet = readme_snippet()
    assert snippet.strip() == USAGE.format(repo=SNIPPET_BUNDLE).strip()  # the model card shows the same lines
    assert len([line for line in snippet.splitlines() if line.strip()]) <= 5
    assert lkv("export", trained_run["run"], "--out", tmp_path / SNIPPET_BUNDLE, "--no-model-check").exit_code == 0
    (tmp_path / "README.md").write_text(PROMPT * 3)
    monkeypatch.chdir(tmp_path)
    printed, scope = io.StringIO(), {}
    with contextlib.redirect_stdout(printed):
        exec(compile(snippet, str(DOCS), "exec"), scope)
    assert isinstance(scope["kv"].model, torch.nn.Module) and printed.getvalue().endswith("\n")
    assert scope["scores"].shape == (2, 2, scope["kv"].encode(scope["prompt"]).shape[1])
    assert torch.allclose(scope["scores"].sum(-1), torch.ones(2, 2))


def test_scores_are_the_checkpoints(kv, trained_run):
    from lkvcli.adapters import load_adapter
    from lkvcli.models import load_model

    ids = kv.encode(PROMPT)
    model = load_model(str(trained_run["model"]), device="cpu").model
    reference = load_adapter(trained_run["run"] / "checkpoints" / "step-000004" / "adapter", model)[0]
    assert torch.equal(kv.scores(ids), reference.predict(ids)[0])
    assert torch.equal(kv.scores(PROMPT), kv.scores(ids.tolist()[0]))


def test_eviction_keeps_the_top_scores_and_shrinks_the_cache(kv):
    from lkvcli.generate import greedy_decode, prefill, stop_token_ids

    ids = kv.encode(PROMPT)
    L = ids.shape[1]
    scores = kv.scores(ids)
    state, ev = kv.evict(ids, budget=8)
    assert all(layer.keys.shape[-2] == 8 for layer in state.cache.layers)
    assert ev.bytes_after * L == ev.bytes_before * 8 and state.next_position == L
    for layer, kept in enumerate(ev.kept):
        assert torch.equal(kept[0], scores[layer].topk(8, dim=-1).indices.sort(-1).values)
    # a budget covering the prompt keeps everything: the answer is the full-cache greedy answer
    full, _ = greedy_decode(kv.model, prefill(kv.model, ids), 6, stop_token_ids(kv.model, kv.tokenizer))
    assert kv.generate(ids, budget=L, max_new_tokens=6) == kv.tokenizer.decode(full, skip_special_tokens=True)
    assert isinstance(kv.generate(PROMPT, budget=0.25, max_new_tokens=4), str)


def test_attaches_to_a_loaded_model(bundle, trained_run):
    from transformers import AutoModelForCausalLM

    from lkvcli import LookaheadKV

    model = AutoModelForCausalLM.from_pretrained(trained_run["model"])
    kv = LookaheadKV.from_pretrained(bundle, model)  # tokenizer found from the model's folder
    assert kv.model is model and kv.tokenizer is not None
    assert kv.scores(PROMPT).shape[:2] == (2, 2)


def test_another_base_model_is_refused(bundle, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lkvcli import LookaheadKV

    other = tiny_llama_folder(tmp_path / "other", seed=1, max_positions=256)
    model, tok = AutoModelForCausalLM.from_pretrained(other), AutoTokenizer.from_pretrained(other)
    with pytest.raises(LkvError, match="allow_fingerprint_mismatch=True"):
        LookaheadKV.from_pretrained(bundle, model, tokenizer=tok)
    kv = LookaheadKV.from_pretrained(bundle, model, tokenizer=tok, allow_fingerprint_mismatch=True)
    assert kv.scores(PROMPT).shape[:2] == (2, 2)


def fake_hub(monkeypatch, folder, calls):
    """``hf_hub_download`` / ``snapshot_download`` serving ``folder`` as a Hub repo (recording the calls)."""
    import shutil

    import huggingface_hub
    from huggingface_hub.errors import RemoteEntryNotFoundError

    def file_download(repo_id, filename, revision=None, endpoint=None):
        calls.append(("file", repo_id, filename, revision, endpoint))
        if not (Path(folder) / filename).is_file():
            missing = RemoteEntryNotFoundError.__new__(RemoteEntryNotFoundError)  # what the Hub's 404 raises
            Exception.__init__(missing, f"{filename} not in {repo_id}")
            raise missing
        return str(Path(folder) / filename)

    def snapshot(repo_id, revision=None, endpoint=None, allow_patterns=None):
        calls.append(("snapshot", repo_id, tuple(allow_patterns), revision, endpoint))
        out = Path(folder).parent / f"snapshot-{len(calls)}"
        shutil.copytree(folder, out, ignore=lambda d, names: [n for n in names if (Path(d) / n).is_file() and not any(
            fnmatch.fnmatch(str((Path(d) / n).relative_to(folder)), pat) for pat in allow_patterns)])
        return str(out)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", file_download)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot)


def test_repo_ids_download_lkv_json_then_only_the_listed_files(bundle, tmp_path, monkeypatch):
    import shutil

    from lkvcli import LookaheadKV

    repo = shutil.copytree(bundle, tmp_path / "repo")
    (repo / "pytorch_model.bin").write_bytes(b"not downloaded: lkv.json does not list it")
    calls = []
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    fake_hub(monkeypatch, repo, calls)
    assert LookaheadKV.from_pretrained("org/lookaheadkv-tiny", revision="v1").meta["num_tokens"] == 4
    assert calls[0] == ("file", "org/lookaheadkv-tiny", "lkv.json", "v1", "http://127.0.0.1:9")
    kind, _, patterns, revision, _ = calls[1]
    assert kind == "snapshot" and revision == "v1" and set(patterns) == {
        "lkv.json", "README.md", "plots/*.png", "adapter_config.json", "adapter_model.safetensors",
        "lookahead_embeddings.safetensors"}
    with pytest.raises(LkvError, match="invalid repo id"):
        LookaheadKV.from_pretrained("no/such/folder")


def test_a_repo_without_lkv_json_is_refused_before_any_download(tmp_path, monkeypatch):
    from lkvcli import LookaheadKV

    (tmp_path / "repo").mkdir()
    (tmp_path / "repo" / "model.safetensors").write_bytes(b"x" * 100)
    calls = []
    fake_hub(monkeypatch, tmp_path / "repo", calls)
    with pytest.raises(LkvError, match="org/some-model is not an lkv bundle repository") as err:
        LookaheadKV.from_pretrained("org/some-model")
    assert "\n" not in str(err.value) and [c[0] for c in calls] == ["file"]


@pytest.mark.parametrize("tamper, message", [
    (lambda b: (b / "adapter_config.json").write_text('{"target_modules": "all"}'), "does not match its checksum"),
    (lambda b: (b / "adapter_model.safetensors").unlink(), "adapter_model.safetensors is missing"),
    (lambda b: (b / "extra.py").write_text("import os"), "extra.py is not a safetensors, JSON, Markdown or PNG"),
    (lambda b: (b / "weights.pt").write_bytes(b"pickle"), "weights.pt is not a safetensors"),
])
def test_tampered_bundles_are_refused_before_loading(bundle, tmp_path, tamper, message):
    import shutil

    from lkvcli import LookaheadKV

    copy = shutil.copytree(bundle, tmp_path / "copy")
    tamper(copy)
    with pytest.raises(LkvError, match=message) as err:
        LookaheadKV.from_pretrained(copy)
    assert "\n" not in str(err.value)


def test_an_edited_model_card_still_loads(bundle, tmp_path):
    import shutil

    from lkvcli import LookaheadKV

    copy = shutil.copytree(bundle, tmp_path / "copy")
    (copy / "README.md").write_text((copy / "README.md").read_text() + "\nEdited on the Hub.\n")
    (copy / ".gitattributes").write_text("*.safetensors filter=lfs\n")
    assert LookaheadKV.from_pretrained(copy).meta["num_tokens"] == 4


def test_a_bundle_never_enables_remote_code(bundle, monkeypatch):
    import lkvcli.api as api
    from lkvcli import LookaheadKV
    from lkvcli.models import load_model

    seen = []

    def spy(source, **kwargs):
        seen.append(kwargs)
        return load_model(source, **kwargs)

    monkeypatch.setattr(api, "load_model", spy)
    LookaheadKV.from_pretrained(bundle)
    assert seen and all(not k.get("trust_remote_code") for k in seen)


def test_unreachable_repo_is_one_clear_error(monkeypatch, tmp_path):
    from huggingface_hub import constants

    from lkvcli import LookaheadKV

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(LkvError, match="not a local folder, and downloading it from the Hub failed"):
        LookaheadKV.from_pretrained("org/not-cached")


def test_import_lkvcli_stays_light():
    code = ("import sys, lkvcli; assert 'torch' not in sys.modules and 'lkvcli.api' not in sys.modules; "
            "from lkvcli import LookaheadKV; print(LookaheadKV.__module__)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "lkvcli.api"
