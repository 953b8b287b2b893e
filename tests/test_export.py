"""`lkv export`: the bundle's files, bit-for-bit verification, atomic replacement, a fresh-process
round trip (LookaheadKV and plain peft), and every bad input as one error line."""

import json
import subprocess
import sys
import textwrap

import pytest
import torch
from helpers import PROMPT, bundle_files, lkv, one_line_error, smollm2_folder


def test_bundle_files_and_metadata(trained_run, bundle):
    from safetensors.torch import load_file

    from lkvcli.models import load_model
    from lkvcli.runs import read_checkpoint_adapter

    assert sorted(bundle_files(bundle)) == ["README.md", "adapter_config.json", "adapter_model.safetensors", "lkv.json",
                                            "lookahead_embeddings.safetensors"]
    ckpt = read_checkpoint_adapter(trained_run["run"])
    assert ckpt.folder.parent.name == "step-000004"
    for name in ("adapter_model.safetensors", "lookahead_embeddings.safetensors"):  # copied, byte for byte
        assert (bundle / name).read_bytes() == (ckpt.folder / name).read_bytes()
    lora, emb = load_file(bundle / "adapter_model.safetensors"), load_file(bundle / "lookahead_embeddings.safetensors")
    assert set(lora) == set(ckpt.lora) and all(torch.equal(lora[k], ckpt.lora[k]) for k in lora)
    assert torch.equal(emb["embeddings"], ckpt.embeddings)
    meta = json.loads((bundle / "lkv.json").read_text())
    fp = load_model(str(trained_run["model"]), device="cpu").fingerprint
    assert meta["format"] == "lkv-bundle" and meta["version"] == 1 and meta["base_model"]["fingerprint"] == fp
    assert meta["num_tokens"] == 4 and meta["lookahead"]["lora_rank"] == 8
    assert meta["scoring"] == {"method": "lookahead", "reduction": "mean", "sink_tokens": 0, "recent_window": 0,
                               "pooling": "none", "pooling_kernel": 7, "pooling_keeps_peaks": False,
                               "allocation": "uniform", "query_reduction": None, "draft_tokens": 0,
                               "draft_weight": 0.1, "draft_combine": "sum"}
    t = meta["training"]
    assert t["steps"] == 4 and t["val_kl"] is not None and t["data"]["sources"] == ["prompts.jsonl"]
    assert t["data"]["val_records"] == 2 and meta["budgets"]["default"] in meta["budgets"]["recommended"]
    peft_cfg = json.loads((bundle / "adapter_config.json").read_text())
    assert peft_cfg["peft_type"] == "LORA" and peft_cfg["r"] == 8 and peft_cfg["base_model_name_or_path"] is None
    card = (bundle / "README.md").read_text()
    assert card.startswith("---\n") and "library_name: peft" in card and "- lookaheadkv" in card
    assert 'LookaheadKV.from_pretrained("lookaheadkv-tiny")' in card
    assert "| allocation | uniform (the same count in every KV head) |" in card
    assert "| the model's own first answer tokens | not used |" in card


def test_card_front_matter_and_base_model_id(trained_run, tmp_path):
    from huggingface_hub import ModelCard

    out = tmp_path / "b"
    r = lkv("export", trained_run["run"], "--out", out, "--checkpoint", "2", "--base-model", "org/tiny-llama",
            "--license", "mit", "--no-model-check")
    assert r.exit_code == 0, r.output
    data = ModelCard.load(out / "README.md").data
    assert data.base_model == "org/tiny-llama" and data.license == "mit" and data.library_name == "peft"
    assert data.tags == ["lookaheadkv", "kv-cache", "lkv"]
    assert json.loads((out / "adapter_config.json").read_text())["base_model_name_or_path"] == "org/tiny-llama"
    assert json.loads((out / "lkv.json").read_text())["training"]["checkpoint"] == "step-000002"


def test_eval_results_go_into_the_card(trained_run, bundle, tmp_path):
    from lkvcli.evaluate import EvalConfig, config_dict, evaluate, setup
    from lkvcli.report import write_results

    results_dir = tmp_path / "results"
    config = EvalConfig(targets=[str(trained_run["run"].parent / "targets")], adapter=str(trained_run["run"]),
                        methods=["lookahead", "streamingllm"], budgets=["4", "8"], parts=["prediction"],
                        out=str(results_dir), split="all", device="cpu", scorers={"lookahead": {"allocation": "global", "draft_tokens": 2,
                                                                            "draft_weight": 0.25}})
    results = evaluate(setup(config))
    write_results(results_dir, {"eval": config_dict(config)}, results)
    out = tmp_path / "with-eval"
    r = lkv("export", trained_run["run"], "--out", out, "--eval", results_dir, "--no-model-check")
    assert r.exit_code == 0, r.output
    card = (out / "README.md").read_text()
    assert "## Evaluation" in card and "| lookahead |" in card and "recall@4" in card and "KL(GT\\|\\|m)" in card
    plots = sorted(p.name for p in (results_dir / "plots").glob("*.png"))
    assert sorted(p.name for p in (out / "plots").glob("*.png")) == plots
    assert all(f"(plots/{p})" in card for p in plots)
    meta = json.loads((out / "lkv.json").read_text())
    assert meta["budgets"]["source"] == "eval" and meta["budgets"]["recommended"] == [4, 8]
    # the allocation and self-draft eval used are the bundle's, and the card says which
    assert meta["scoring"]["allocation"] == "global" and "| allocation | global (one top over" in card
    assert meta["scoring"]["draft_tokens"] == 2 and meta["scoring"]["draft_weight"] == 0.25
    assert "| the model's own first answer tokens | the first 2 greedy tokens' attention mixed in, weight 0.25" in card


def test_round_trip_in_a_fresh_process(trained_run, bundle, tmp_path):
    """Scores from the checkpoint in this (training) process == scores from the bundle in a new process."""
    from lkvcli.chat import chat_ids
    from lkvcli.adapters import load_adapter
    from lkvcli.models import load_model

    loaded = load_model(str(trained_run["model"]), device="cpu")
    ids = torch.tensor([chat_ids(loaded.tokenizer, [{"role": "user", "content": PROMPT}])[0]])
    ckpt = trained_run["run"] / "checkpoints" / "step-000004" / "adapter"
    reference = load_adapter(ckpt, loaded.model)[0].predict(ids)[0]
    torch.save({"ids": ids, "scores": reference}, tmp_path / "reference.pt")
    script = textwrap.dedent(f"""
        import json, torch
        from peft import PeftModel
        from safetensors.torch import load_file
        from transformers import AutoModelForCausalLM
        from lkvcli import LookaheadKV
        ref = torch.load({str(tmp_path / 'reference.pt')!r})
        kv = LookaheadKV.from_pretrained({str(bundle)!r})
        diff = (kv.scores(ref["ids"]) - ref["scores"]).abs().max().item()
        same_prompt = torch.equal(kv.encode({PROMPT!r}).cpu(), ref["ids"])
        base = AutoModelForCausalLM.from_pretrained({str(trained_run['model'])!r})
        peft = PeftModel.from_pretrained(base, {str(bundle)!r})
        saved = load_file({str(bundle / 'adapter_model.safetensors')!r})
        state = peft.state_dict()
        ok = all(torch.equal(state[k.replace(".weight", ".default.weight")], v) for k, v in saved.items())
        print(json.dumps({{"diff": diff, "same_prompt": same_prompt, "peft_ok": ok, "n": len(saved)}}))
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"round trip: max |score difference| = {got['diff']:.3g} over {reference.numel()} scores")
    assert got["diff"] <= 1e-6 and got["same_prompt"] and got["peft_ok"] and got["n"] == 2 * 7 * 2


def test_existing_out_is_refused_unless_overwrite(trained_run, tmp_path):
    out = tmp_path / "b"
    assert lkv("export", trained_run["run"], "--out", out, "--checkpoint", "step-000002",
               "--no-model-check").exit_code == 0
    before = bundle_files(out)
    one_line_error(lkv("export", trained_run["run"], "--out", out, "--no-model-check"), "already exists", "--overwrite")
    assert bundle_files(out) == before
    r = lkv("export", trained_run["run"], "--out", out, "--overwrite", "--no-model-check")
    assert r.exit_code == 0, r.output
    assert json.loads((out / "lkv.json").read_text())["training"]["checkpoint"] == "step-000004"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp folders left behind


def test_overwrite_never_replaces_other_folders(trained_run, tmp_path):
    other = tmp_path / "notes"
    other.mkdir()
    (other / "keep.txt").write_text("mine")
    one_line_error(lkv("export", trained_run["run"], "--out", other, "--overwrite"), "not an lkv bundle")
    one_line_error(lkv("export", trained_run["run"], "--out", trained_run["run"], "--overwrite"), "training run")
    assert (other / "keep.txt").read_text() == "mine"


def test_run_without_checkpoint(trained_run, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text((trained_run["run"] / "run.json").read_text())
    one_line_error(lkv("export", run, "--out", tmp_path / "b"), "no checkpoint")
    one_line_error(lkv("export", tmp_path, "--out", tmp_path / "b"), "not a training run folder")
    one_line_error(lkv("export", trained_run["run"], "--out", tmp_path / "b", "--checkpoint", "7"),
                   "step-000002, step-000004")
    assert not (tmp_path / "b").exists()


def test_corrupted_checkpoint(trained_run, tmp_path):
    import shutil

    run = shutil.copytree(trained_run["run"], tmp_path / "run")
    weights = run / "checkpoints" / "step-000004" / "adapter" / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    one_line_error(lkv("export", run, "--out", tmp_path / "b"), "unreadable", "--checkpoint", "step-000002")
    assert not (tmp_path / "b").exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_damaged_bundle_is_refused(bundle, tmp_path):
    import shutil

    from lkvcli.bundle import read_bundle
    from lkvcli.errors import LkvError

    copy = shutil.copytree(bundle, tmp_path / "copy")
    data = bytearray((copy / "lookahead_embeddings.safetensors").read_bytes())
    data[-1] ^= 1
    (copy / "lookahead_embeddings.safetensors").write_bytes(bytes(data))
    with pytest.raises(LkvError, match="checksum"):
        read_bundle(copy)
    one_line_error(lkv("export", copy, "--out", tmp_path / "x"), "already a bundle")


@pytest.mark.integration
@pytest.mark.slow
def test_smollm2_bundle_size(tmp_path):
    """SmolLM2-135M, default 32 tokens, rank 8 on every linear layer: an untrained adapter's bundle."""
    from lkvcli.export import export
    from lkvcli.lookahead import LookaheadAdapter
    from lkvcli.models import load_model
    from lkvcli.runs import save_checkpoint

    smollm2_folder()
    loaded = load_model("smollm2-135m-instruct", device="cpu")
    params = sum(p.numel() for p in loaded.model.parameters())
    adapter = LookaheadAdapter.attach(loaded.model)
    run = tmp_path / "run"
    save_checkpoint(run, 0, adapter=adapter, states={}, position=0, seed=0, config={}, keep=1)
    (run / "run.json").write_text(json.dumps({"format": "lkv-run", "version": 1, "model": {
        "source": loaded.source, "fingerprint": loaded.fingerprint}}))
    summary = export(run, tmp_path / "bundle", check_model=False)
    trainable = adapter.num_parameters()
    print(f"SmolLM2-135M bundle: {summary['bytes']:,} bytes ({summary['files']}); trainable {trainable:,} = "
          f"{100 * trainable / params:.2f}% of {params:,} parameters")
    assert trainable == 32 * 576 + 30 * 8 * (2 * (576 + 576) + 2 * (576 + 192) + 3 * (576 + 1536))
    assert summary["files"]["adapter_model.safetensors"] < 4 * (trainable - 32 * 576) + 100_000
    assert summary["base_model"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
