"""Critical-entry metrics: the built-in tasks' fact spans, critical/copy recall against a hand
computation, and `lkv eval` writing them end to end on a tiny model."""

import json
from collections import Counter

import pytest
import torch
from helpers import smollm2_folder, tiny_llama_folder
from typer.testing import CliRunner

from lkvcli.cli import app
from lkvcli.chat import chat_ids
from lkvcli.collect import critical_spans
from lkvcli.evaluate.aggregate import aggregate_prediction
from lkvcli.evaluate.metrics import prediction_metrics
from lkvcli.targets import copied_runs
from lkvcli.prompts import load_prompts
from lkvcli.scorers import get_scorer


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_folder())


def test_builtin_spans_decode_to_the_inserted_facts(tokenizer):
    records = load_prompts("builtin:n=33,min_tokens=300,max_tokens=600,tasks=all,texts=all", seed=5,
                           tokenizer=tokenizer)
    assert {r.task for r in records} == {"needle", "multi_needle", "kv_lookup", "var_tracking", "freq_words",
                                         "summarise", "explain", "list", "multi_kv", "counting", "passage_qa", "chat"}
    for r in records:
        ids, text = chat_ids(tokenizer, r.messages)
        spans = critical_spans(tokenizer, text, r)
        if r.task in ("summarise", "explain", "list", "chat"):
            assert spans is None
            continue
        for s in spans:
            start, end = s["span"]
            assert 0 <= start < end <= len(ids)
            assert tokenizer.decode(ids[start:end]).strip() == s["text"], (r.id, s)
        texts = [s["text"] for s in spans]
        if r.task in ("needle", "kv_lookup", "passage_qa"):
            assert texts == [r.answer]
        elif r.task in ("multi_needle", "multi_kv"):
            assert texts == r.answer
        elif r.task == "counting":  # every report of the asked team
            assert len(texts) == len(r.meta["counts"]) and all(r.meta["key"] in t for t in texts)
        elif r.task == "var_tracking":  # the main chain's assignments, in order
            assert [t.split()[1] for t in texts] == r.answer and texts[0].endswith(r.meta["value"])
        else:  # freq_words: every occurrence of a top word in the list
            counts = Counter(texts)
            assert set(counts) == set(r.answer)
            listed = Counter(line.split(". ", 1)[1] for line in r.context.split("\n"))
            assert all(counts[w] == listed[w] for w in r.answer)


class Uniform:
    """The attributes prediction_metrics reads from a scorer: top-C per head, nothing protected."""

    distribution, sink_tokens, recent_window, allocation = False, 0, 0, "uniform"

    def layer_budgets(self, c, layers, L):
        return [c] * layers


# scores (1, layers=2, kv=2, L=8); budget 3 keeps each head's 3 highest positions
SCORES = torch.tensor([[[[0, 0, 9, 8, 0, 0, 0, 7], [0, 0, 9, 8, 0, 7, 0, 0]],
                        [[9, 8, 7, 0, 0, 0, 0, 0], [0, 0, 1, 2, 3, 0, 0, 9]]]], dtype=torch.float)
SPANS = [(2, 4), (7, 8)]  # tokens 2, 3 and 7


def _hand(budget):
    """Independent reference: per (layer, head) the kept set by sorting, then shares by counting."""
    recall, whole = [], []
    for layer in SCORES[0].tolist():
        r_l, w_l = [], []
        for row in layer:
            kept = set(sorted(range(len(row)), key=lambda i: -row[i])[:budget])
            tokens = [t for s, e in SPANS for t in range(s, e)]
            r_l.append(sum(t in kept for t in tokens) / len(tokens))
            w_l.append(float(all(t in kept for t in tokens)))
        recall.append(sum(r_l) / len(r_l))
        whole.append(sum(w_l) / len(w_l))
    return recall, whole


def test_critical_recall_and_heads_match_a_hand_computation():
    target = torch.softmax(SCORES[0], -1)
    m = prediction_metrics(Uniform(), SCORES, target, [3], critical=SPANS)["budgets"][3]
    recall, whole = _hand(3)
    assert recall == pytest.approx([(1 + 2 / 3) / 2, (1 / 3 + 2 / 3) / 2])  # the hand numbers themselves
    assert whole == [0.5, 0.0]
    assert m["critical_recall_by_layer"] == pytest.approx(recall)
    assert m["critical_heads_by_layer"] == pytest.approx(whole)
    assert m["critical_recall"] == pytest.approx(sum(recall) / 2)
    assert m["critical_heads"] == pytest.approx(0.25)
    assert "copy_recall" not in m


def test_copy_runs_and_copy_recall():
    prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    assert copied_runs(prompt, [9, 3, 4, 5, 6, 0, 8, 9, 10]) == [(2, 6)]  # a run of 3 does not count
    assert copied_runs(prompt, [3, 4, 5, 6, 7]) == [(2, 6), (3, 7)]
    assert copied_runs(prompt, [1, 2, 3]) == []
    spans = copied_runs(prompt[:8], [2, 3, 4, 5, 6])  # prompt tokens 1..5 copied
    m = prediction_metrics(Uniform(), SCORES, torch.softmax(SCORES[0], -1), [3], copied=spans)["budgets"][3]
    hand = [[len({1, 2, 3, 4, 5} & set(sorted(range(8), key=lambda i: -row[i])[:3])) / 5 for row in layer]
            for layer in SCORES[0].tolist()]
    assert m["copy_recall_by_layer"] == pytest.approx([sum(h) / 2 for h in hand])
    assert m["copy_recall"] == pytest.approx(sum(map(sum, hand)) / 4)
    assert "critical_recall" not in m and "copy_heads" not in m


def test_oracle_keeps_every_span_at_full_budget_and_layers_kept_whole_count_as_one():
    target = torch.softmax(SCORES[0], -1)
    oracle = get_scorer("oracle")
    for budget in (8, 100):
        m = prediction_metrics(oracle, target[None], target, [budget], critical=SPANS)["budgets"][budget]
        assert m["critical_recall"] == m["critical_heads"] == 1.0
        assert m["critical_recall_by_layer"] == m["critical_heads_by_layer"] == [1.0, 1.0]


def test_aggregate_reads_old_rows_and_averages_layers_elementwise():
    common = {"part": "prediction", "method": "snapkv", "budget": "8", "kl": 0.1, "recall": 0.5,
              "recall_nosink": 0.4, "overlap": 0.3}
    rows = [{**common, "id": "old"},  # a journal row written before the critical metrics
            {**common, "id": "a", "critical_recall": 0.5, "critical_recall_by_layer": [0.25, 0.75],
             "critical_heads": 0.0, "critical_heads_by_layer": [0.0, 0.0]},
            {**common, "id": "b", "critical_recall": 1.0, "critical_recall_by_layer": [1.0, 1.0],
             "critical_heads": 1.0, "critical_heads_by_layer": [1.0, 1.0]}]
    out = aggregate_prediction(rows, ["snapkv"], ["8"])["snapkv"]
    entry = out["budgets"]["8"]
    assert entry["recall"] == 0.5 and entry["critical_recall"] == 0.75 and entry["critical_heads"] == 0.5
    assert entry["critical_recall_by_layer"] == [0.625, 0.875] and entry["copy_recall"] is None
    assert out["critical_records"] == 2 and out["copy_records"] == 0
    assert aggregate_prediction(rows[:1], ["snapkv"], ["8"])["snapkv"]["budgets"]["8"]["critical_recall"] is None


def test_eval_writes_critical_fields_end_to_end(tmp_path):
    from lkvcli.collect import CollectConfig, collect

    model = tiny_llama_folder(tmp_path / "model", max_positions=512)
    collect(CollectConfig(model=str(model), data="builtin:n=3,min_tokens=200,max_tokens=300,"
                          "tasks=needle+kv_lookup+summarise,seed=1", out=str(tmp_path / "t"), max_new_tokens=4))
    metas = {m["task"]: m for m in map(json.loads, (tmp_path / "t" / "records.jsonl").read_text().splitlines())}
    assert [s["text"] for s in metas["needle"]["critical_spans"]] == [metas["needle"]["answer"]]
    assert "critical_spans" not in metas["summarise"]
    out = tmp_path / "r"
    r = CliRunner().invoke(app, ["eval", "--targets", str(tmp_path / "t"), "--methods", "oracle,snapkv,streamingllm",
                                 "--parts", "prediction", "--budgets", "1.0,16", "--split", "all", "--out", str(out)])
    assert r.exit_code == 0, r.output
    rows = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    for row in rows:
        if row["task"] == "summarise":
            assert "critical_recall" not in row
            continue
        assert 0 <= row["critical_recall"] <= 1 and len(row["critical_heads_by_layer"]) == 2
        if row["budget"] == "1":
            assert row["critical_recall"] == row["critical_heads"] == 1.0
    results = json.loads((out / "results.json").read_text())
    for entry in results["prediction"].values():
        assert entry["critical_records"] == 2 and entry["budgets"]["1"]["critical_recall"] == 1.0
        assert len(entry["budgets"]["16"]["critical_recall_by_layer"]) == 2
    assert (out / "plots" / "critical_by_layer.png").is_file()
    assert "Critical recall" in (out / "report.md").read_text()
