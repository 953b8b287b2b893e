"""LookaheadKVPress inside kvpress (run by `make test-kvpress`, in a virtual environment holding kvpress
from PyPI and the transformers it pins; skipped where kvpress is not installed, except the test of
the message that names the extra).

On a tiny Llama with a trained bundle: the press's scores are lkv's own; the cache it leaves holds
kvpress's count of entries per head, the ones lkv's eviction keeps; kvpress's pipeline answers as
lkv's context mode does (context evicted, question fed after, greedy decoding); under
``model.generate`` it answers as lkv's whole mode; bad input gives one line."""

import importlib
import sys

import pytest
import torch
from helpers import PROMPT, lkv, smollm2_folder, tiny_llama_folder

from lkvcli.errors import LkvError


def test_without_kvpress_the_error_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "kvpress", None)  # as if not installed
    monkeypatch.delitem(sys.modules, "lkvcli.integrations.kvpress", raising=False)
    with pytest.raises(LkvError, match=r"pip install 'lkvcli\[kvpress\]'"):
        importlib.import_module("lkvcli.integrations.kvpress")


@pytest.fixture()
def model(trained_run):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(trained_run["model"]).eval()


@pytest.fixture(scope="module")
def kv(bundle):
    """The bundle in lkv (overriding conftest's ``kv`` in this module), cutting with the uniform allocation
    that kvpress's count per head is."""
    import dataclasses

    from lkvcli import LookaheadKV

    loaded = LookaheadKV.from_pretrained(bundle)
    loaded.scorer = dataclasses.replace(loaded.scorer, allocation="uniform")
    return loaded


def press_for(bundle, **kwargs):
    pytest.importorskip("kvpress")
    from lkvcli.integrations.kvpress import LookaheadKVPress

    return LookaheadKVPress.from_pretrained(bundle, **kwargs)


def test_scores_and_kept_entries_are_lkvs_own(bundle, model, kv):
    from transformers import DynamicCache

    from lkvcli.generate import prefill

    press = press_for(bundle, compression_ratio=0.6)
    ids = kv.encode(PROMPT)
    L = ids.shape[1]
    cache = DynamicCache(config=model.config)
    with torch.no_grad(), press(model):
        model.model(input_ids=ids, past_key_values=cache)  # what kvpress's pipeline runs
    assert (press.last_scores - kv.scores(ids)).abs().max() <= 1e-5
    kept = max(1, int(L * (1 - 0.6)))
    assert all(layer.keys.shape[-2] == kept for layer in cache.layers) and cache.get_seq_length() == kept
    from lkvcli.evict import compress

    ours, _ = compress(kv.scorer, kv.scores(ids)[None], prefill(kv.model, ids), kept)
    for layer, ref in zip(cache.layers, ours.cache.layers):
        assert torch.allclose(layer.keys, ref.keys, atol=1e-5) and torch.allclose(layer.values, ref.values, atol=1e-5)


def test_the_pipeline_answers_as_lkvs_context_mode(bundle, model, kv):
    pytest.importorskip("kvpress")  # registers "kv-press-text-generation"
    from transformers import pipeline

    from lkvcli.evict import compress, feed
    from lkvcli.generate import greedy_decode, prefill, stop_token_ids

    pipe = pipeline("kv-press-text-generation", model=model, tokenizer=kv.tokenizer, device="cpu")
    context, question = PROMPT, "Which item comes first?"
    for ratio in (0.5, 0.8):
        press = press_for(bundle, compression_ratio=ratio)
        answer = pipe(context, question=question, press=press, max_new_tokens=8)["answer"]
        inputs = pipe.preprocess(context, [question], answer_prefix="", max_context_length=10**6)
        ctx_ids, q_ids = inputs["context_ids"], inputs["questions_ids"][0]
        state = prefill(kv.model, ctx_ids)
        budget = max(1, int(ctx_ids.shape[1] * (1 - ratio)))
        state, _ = compress(kv.scorer, kv.scores(ctx_ids)[None], state, budget)
        feed(kv.model, state, q_ids)
        tokens, _ = greedy_decode(kv.model, state, 8, stop_token_ids(kv.model, kv.tokenizer))
        assert answer and answer == kv.tokenizer.decode(tokens, skip_special_tokens=True), ratio


def test_model_generate_under_the_press_answers_as_lkvs_whole_mode(bundle, model, kv):
    press = press_for(bundle, budget=6)
    ids = kv.encode(PROMPT)
    with torch.no_grad(), press(model):
        out = model.generate(ids, max_new_tokens=8, do_sample=False, attention_mask=torch.ones_like(ids),
                             pad_token_id=0)[0, ids.shape[1]:].tolist()
    answer = kv.tokenizer.decode(out, skip_special_tokens=True)
    assert answer and answer == kv.generate(ids, budget=6, max_new_tokens=8)


@pytest.mark.parametrize("kwargs, message", [
    ({"compression_ratio": 1.0}, "compression_ratio=1.0: must be in [0, 1)"),
    ({"compression_ratio": -0.1}, "compression_ratio=-0.1: must be in [0, 1)"),
    ({"budget": 0}, "budget=0: must be a positive number"),
])
def test_bad_settings_fail_with_one_line(bundle, kwargs, message):
    with pytest.raises(LkvError) as err:
        press_for(bundle, **kwargs)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_bundle_for_another_model_is_refused(bundle, tmp_path):
    from transformers import AutoModelForCausalLM

    other = AutoModelForCausalLM.from_pretrained(tiny_llama_folder(tmp_path / "other", seed=1, max_positions=256))
    press = press_for(bundle, compression_ratio=0.5)
    with pytest.raises(LkvError, match="allow_fingerprint_mismatch=True"), press(other):
        pass


def test_readme_snippet_runs_as_written(trained_run, tmp_path, monkeypatch):
    """The README's kvpress block, after its first block (which defines ``kv``), on the tiny bundle."""
    import contextlib
    import io
    import re
    from pathlib import Path

    pytest.importorskip("kvpress")
    blocks = re.findall(r"```python\n(.*?)```", (Path(__file__).resolve().parents[1] / "README.md").read_text(), re.S)
    first, snippet = blocks[0], next(b for b in blocks if "LookaheadKVPress" in b)
    assert lkv("export", trained_run["run"], "--out", tmp_path / ".lkv-demo/bundle", "--no-model-check").exit_code == 0
    (tmp_path / "README.md").write_text(PROMPT * 3)
    monkeypatch.chdir(tmp_path)
    printed, scope = io.StringIO(), {}
    with contextlib.redirect_stdout(printed):
        exec(compile(first + snippet, "README.md", "exec"), scope)
    assert printed.getvalue().count("\n") >= 2 and scope["press"].last_scores is not None
    L = scope["press"].last_scores.shape[-1]
    assert scope["press"].last_scores.shape[:2] == (2, 2) and L > 10


@pytest.mark.integration
def test_pipeline_answers_equal_lkv_eval_context_mode_on_smollm2(tmp_path):
    """Real SmolLM2 records from `lkv collect` and a bundle trained on them: kvpress's pipeline, run on each
    record's context and question as lkv splits them, answers exactly as `lkv eval --mode context` does at the
    same budget (the press keeps ``budget`` entries per head). From text, kvpress tokenizes the context and
    the question apart, which merges the blank line ending the context into one token (lkv's prompt,
    tokenized whole, has two): the only difference in the token ids, checked here too."""
    import json

    pytest.importorskip("kvpress")
    from transformers import pipeline

    from lkvcli.context_mode import context_split
    from lkvcli.models import load_model
    from lkvcli.targets import TargetsReader

    smollm2_folder()
    targets, run, bundle_dir, results = (tmp_path / n for n in ("targets", "run", "bundle", "results"))
    steps = [
        ["collect", "--data", "builtin:n=3,min_tokens=250,max_tokens=400,tasks=needle+passage_qa+counting,seed=5",
         "--out", targets, "--max-new-tokens", 8, "--device", "cpu"],
        ["train", "--data", targets, "--out", run, "--steps", 2, "--batch-size", 1, "val_split=1",
         "lookahead.num_tokens=4", "device=cpu", "dtype=float32"],
        ["export", run, "--out", bundle_dir, "--no-model-check"],
        ["eval", "--targets", targets, "--adapter", bundle_dir, "--methods", "lookahead", "--budgets", "32,64",
         "--parts", "answers", "--split", "all", "--out", results, "mode=context", "max_new_tokens=8", "dtype=float32"],
    ]
    for args in steps:
        r = lkv(*map(str, args))
        assert r.exit_code == 0, r.output
    rows = [json.loads(line) for line in (results / "predictions.jsonl").read_text().splitlines()]
    ours = {(r["id"], r["budget"]): r["answer_text"] for r in rows if r["method"] == "lookahead"}
    loaded = load_model("smollm2-135m-instruct", device="cpu", dtype="float32")
    pipe = pipeline("kv-press-text-generation", model=loaded.model, tokenizer=loaded.tokenizer, device="cpu")
    reader = TargetsReader(targets)
    compared = 0
    for i in range(len(reader)):
        record = reader[i]
        cut = context_split(record, loaded.tokenizer)
        ids = record.prompt_ids[None]
        from_text = pipe.preprocess(record.meta["context"] + "\n\n", [record.meta["question"]], answer_prefix="",
                                    max_context_length=10**6)
        assert from_text["questions_ids"][0].tolist() == ids[:, cut:].tolist()
        assert from_text["context_ids"][0, -1] == loaded.tokenizer.encode("\n\n")[0]  # one token for two
        assert from_text["context_ids"][0, :-1].tolist() == ids[0, :cut - 2].tolist()
        for budget in (32, 64):
            press = press_for(bundle_dir, budget=budget)
            answer = pipe._forward({"context_ids": ids[:, :cut], "questions_ids": [ids[:, cut:]]}, max_new_tokens=8,
                                   press=press)[0]
            assert answer == ours[(record.id, str(budget))], (record.id, budget)
            compared += 1
    assert compared == 6
