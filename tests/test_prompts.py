"""Tests for lkvcli.prompts: files, saved datasets and the builtin generator."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from collections import Counter
from importlib import resources
from pathlib import Path
from types import SimpleNamespace

import pytest

from lkvcli.prompts import TASKS, PromptRecord, PromptSourceError, load_prompts
from lkvcli.prompts.corpus import insert_paragraphs, load_plays
from lkvcli.prompts.tasks import DEFAULT_TASKS

SRC = Path(__file__).resolve().parents[1] / "src"
SMALL = "min_tokens=300,max_tokens=600"


class WhitespaceTokenizer:
    """Tokenizer-like object: one token per whitespace-separated word."""

    def __call__(self, text, add_special_tokens=False):
        return SimpleNamespace(input_ids=text.split())


class DictTokenizer:
    """Returns a mapping like a BatchEncoding without attribute access."""

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": list(text)}


def as_dicts(records):
    return [dataclasses.asdict(r) for r in records]


def builtin(task, n=3, **kw):
    return load_prompts(f"builtin:n={n},{SMALL},tasks={task}", tokenizer=WhitespaceTokenizer(), **kw)


# ---------------------------------------------------------------- builtin: determinism and mix

def test_builtin_is_deterministic_and_seed_dependent():
    a = load_prompts(f"builtin:n=8,{SMALL}", seed=1)
    b = load_prompts(f"builtin:n=8,{SMALL}", seed=1)
    c = load_prompts(f"builtin:n=8,{SMALL}", seed=2)
    assert as_dicts(a) == as_dicts(b)
    assert [r.messages for r in a] != [r.messages for r in c]
    assert as_dicts(load_prompts(f"builtin:n=4,{SMALL},seed=7", seed=0)) == as_dicts(
        load_prompts(f"builtin:n=4,{SMALL}", seed=7))


def test_builtin_independent_of_hash_randomisation():
    code = ("import dataclasses, hashlib, json; from lkvcli.prompts import load_prompts; "
            "r = load_prompts('builtin:n=8,min_tokens=300,max_tokens=600', seed=3); "
            "print(hashlib.sha256(json.dumps([dataclasses.asdict(x) for x in r]).encode()).hexdigest())")
    digests = set()
    for hash_seed in ("1", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed, "PYTHONPATH": str(SRC)}
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        digests.add(out.stdout.strip())
    assert len(digests) == 1


def test_builtin_defaults_balanced_mix_and_prefix_stable():
    records = load_prompts(f"builtin:n=16,{SMALL}")
    assert Counter(r.task for r in records) == {task: 2 for task in DEFAULT_TASKS}
    assert len({r.id for r in records}) == 16
    assert records[0].id == f"{records[0].task}-0-0"
    assert as_dicts(load_prompts(f"builtin:n=16,{SMALL}", limit=5)) == as_dicts(records[:5])
    assert len(load_prompts("builtin:", limit=2)) == 2  # defaults: 1000-2000 tokens


def test_builtin_task_groups():
    assert {r.task for r in load_prompts(f"builtin:n=16,{SMALL},tasks=closed")} == {
        "needle", "multi_needle", "kv_lookup", "var_tracking", "freq_words", "multi_kv", "counting", "passage_qa"}
    assert {r.task for r in load_prompts(f"builtin:n=8,{SMALL},tasks=open")} == {"summarise", "explain", "list", "chat"}


# ---------------------------------------------------------------- builtin: lengths

@pytest.mark.parametrize("tokenizer", [None, WhitespaceTokenizer()], ids=["estimate", "whitespace"])
def test_builtin_lengths_in_range(tokenizer):
    records = load_prompts(f"builtin:n=16,{SMALL}", tokenizer=tokenizer, seed=4)
    for r in records:
        text = r.messages[0]["content"]
        n = len(text.split()) if tokenizer else -(-len(text.split()) * 4 // 3)
        assert n == r.meta["prompt_tokens"]
        assert 300 <= n <= 600, (r.id, n)
        assert n <= r.meta["target_tokens"] or n < 300 * 1.05


def test_builtin_lengths_with_mapping_tokenizer_and_long_range():
    # Character-level "tokenizer": many tokens per word; still within 5% of the range.
    for r in load_prompts("builtin:n=8,min_tokens=3000,max_tokens=3500", tokenizer=DictTokenizer()):
        assert 3000 * 0.95 <= len(r.messages[0]["content"]) <= 3500 * 1.05
    # Longer than any single play (by the estimate): the haystack spills into the next play.
    (rec,) = load_prompts("builtin:n=1,min_tokens=60000,max_tokens=60000,tasks=needle")
    assert abs(rec.meta["prompt_tokens"] - 60000) <= 3000
    assert rec.meta["haystack"]["continues_into"]


# ---------------------------------------------------------------- builtin: answers are in the context

def check_layout(r: PromptRecord):
    assert r.messages == [{"role": "user", "content": f"{r.context}\n\n{r.question}"}]
    assert r.context and r.question and r.question not in r.context


def test_needle():
    for r in builtin("needle"):
        check_layout(r)
        assert re.fullmatch(r"\d{7}", r.answer) and r.metric == "contains_all"
        assert f"The special magic number for {r.meta['key']} is {r.answer}." in r.context
        assert r.meta["key"] in r.question
        assert r.context.count(r.answer) == 1


def test_multi_needle():
    for r in builtin("multi_needle"):
        check_layout(r)
        assert 2 <= len(r.answer) <= 4 and r.metric == "contains_all"
        for key, number in zip(r.meta["keys"], r.answer):
            assert f"The special magic number for {key} is {number}." in r.context
            assert key in r.question


def test_kv_lookup():
    for r in builtin("kv_lookup"):
        check_layout(r)
        key = r.meta["key"]
        assert f'"{key}": "{r.answer}"' in r.context
        assert r.context.count(key) == 1 and f'"{key}"' in r.question
        assert 2 <= r.meta["n_pairs"] <= 60
        assert len(re.findall(r'^ "[0-9a-f]{8}-[0-9a-f]{4}": "[0-9a-f]{8}-[0-9a-f]{4}"', r.context, re.M)) == r.meta["n_pairs"]


def test_var_tracking():
    for r in builtin("var_tracking"):
        check_layout(r)
        value, chain = r.meta["value"], r.answer
        assert 3 <= len(chain) <= 5 and r.metric == "contains_all" and value in r.question
        positions = [r.context.index(f"VAR {chain[0]} = {value}")]
        for prev, var in zip(chain, chain[1:]):
            positions.append(r.context.index(f"VAR {var} = VAR {prev}"))
        assert positions == sorted(positions)
        assert not set(r.meta["distractors"]) & set(chain)
        assert f"= {value}" not in r.context.replace(f"VAR {chain[0]} = {value}", "")


def test_freq_words():
    for r in builtin("freq_words"):
        check_layout(r)
        items = re.findall(r"^\d+\. (\S+)$", r.context, re.M)
        assert len(items) == len(r.context.splitlines())
        counts = Counter(items)
        assert len(r.answer) == 3
        top = min(counts[w] for w in r.answer)
        assert top > max(c for w, c in counts.items() if w not in r.answer)


@pytest.mark.parametrize("task", ["summarise", "explain", "list", "chat"])
def test_open_tasks(task):
    plays = {p.file: p for p in load_plays()}
    for r in builtin(task, n=4):
        check_layout(r)
        assert r.answer is None and r.metric == "agreement"
        hay = r.meta["haystack"]
        play = plays[hay["file"]]
        assert r.context.split("\n")[0] == play.lines[hay["start_line"] - 1]  # starts at a speech
        assert r.context in "\n".join(play.lines)  # a contiguous slice of real text
        quoted = re.search(r'"(.+)"', r.question)
        if quoted:
            assert quoted.group(1) in r.context
        if task == "list":
            for speaker in r.meta["speakers"]:
                assert f"\n{speaker}" in "\n" + r.context


def test_insert_paragraphs_keeps_order_and_paragraphs():
    lines = ["A.", "one", "", "B.", "two", "", "C.", "three"]
    text = insert_paragraphs(lines, [(0.0, "X"), (0.5, "Y"), (0.5, "Z"), (1.0, "W")])
    assert text == "X\n\nA.\none\n\nY\n\nZ\n\nB.\ntwo\n\nC.\nthree\n\nW"


def test_vendored_texts():
    root = resources.files("lkvcli.prompts").joinpath("texts")
    sources = json.loads(root.joinpath("SOURCES.json").read_text("utf-8"))
    txt = sorted(e.name for e in root.iterdir() if e.name.endswith(".txt"))
    assert sorted(f["file"] for f in sources["files"]) == txt and len(txt) >= 10
    assert sum(len(root.joinpath(name).read_bytes()) for name in txt) < 3_000_000


# ---------------------------------------------------------------- builtin: bad options

@pytest.mark.parametrize("spec, needle", [
    ("builtin:foo=1", "'foo'"),
    ("builtin:n=0", "n=0"),
    ("builtin:n=abc", "n=abc"),
    ("builtin:min_tokens=50", "min_tokens"),
    ("builtin:min_tokens=900,max_tokens=500", "min_tokens"),
    ("builtin:tasks=needle+bogus", "'bogus'"),
    ("builtin:n=2,n=3", "twice"),
    ("builtin:seed", "no value"),
])
def test_builtin_bad_options(spec, needle):
    with pytest.raises(PromptSourceError) as err:
        load_prompts(spec)
    msg = str(err.value)
    assert needle in msg and "\n" not in msg
    if "unknown" in msg:
        assert "accepted" in msg


# ---------------------------------------------------------------- files

ROWS = [
    {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi?"}], "id": "m1"},
    {"prompt": "Name a colour.", "answers": ["red", "blue"], "task": "colours"},
    {"context": "The cat is black.", "question": "What colour is the cat?", "answer": ["black"],
     "answer_prefix": "Answer:", "max_new_tokens": 8, "extra": 3},
]

# Tables need every column in every row (pyarrow and datasets take the columns from the first row).
KEYS = sorted({k for row in ROWS for k in row})
FULL_ROWS = [{k: row.get(k) for k in KEYS} for row in ROWS]


def check_rows(records, stem, first_index):
    m, p, c = records
    assert m.id == "m1" and m.messages[0]["role"] == "system" and m.metric == "agreement" and m.answer is None
    assert p.id == f"{stem}-{first_index + 1}" and p.messages == [{"role": "user", "content": "Name a colour."}]
    assert p.answer == ["red", "blue"] and p.metric == "contains_any" and p.task == "colours"
    assert c.messages == [{"role": "user", "content": "The cat is black.\n\nWhat colour is the cat?"}]
    assert (c.context, c.question, c.answer, c.metric) == ("The cat is black.", "What colour is the cat?",
                                                          ["black"], "contains_all")
    assert c.meta["answer_prefix"] == "Answer:" and c.meta["max_new_tokens"] == 8 and c.meta["extra"] == 3


def test_jsonl(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_text(json.dumps(ROWS[0]) + "\n\n" + json.dumps(ROWS[1]) + "\n" + json.dumps(ROWS[2]) + "\n   \n")
    records = load_prompts(str(path))
    assert [r.id for r in records] == ["m1", "data-3", "data-4"]  # ids from 1-based line numbers
    check_rows([records[0], records[1], records[2]], "data", 2)
    assert len(load_prompts(str(path), limit=2)) == 2


@pytest.mark.parametrize("wrap", [lambda rows: rows, lambda rows: {"data": rows}, lambda rows: {"records": rows}])
def test_json(tmp_path, wrap):
    path = tmp_path / "set.json"
    path.write_text(json.dumps(wrap(ROWS)))
    check_rows(load_prompts(str(path)), "set", 0)


def test_parquet(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    path = tmp_path / "set.parquet"
    pq.write_table(pa.Table.from_pylist(FULL_ROWS), path)  # missing fields are nulls
    check_rows(load_prompts(str(path)), "set", 0)


def test_save_to_disk(tmp_path):
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_list(FULL_ROWS).save_to_disk(str(tmp_path / "single"))
    check_rows(load_prompts(str(tmp_path / "single")), "single", 0)
    dd = datasets.DatasetDict({"train": datasets.Dataset.from_list(FULL_ROWS[1:]),
                               "test": datasets.Dataset.from_list(FULL_ROWS[2:])})
    dd.save_to_disk(str(tmp_path / "dd"))
    assert [r.question for r in load_prompts(str(tmp_path / "dd"))] == [ROWS[2]["question"]]  # default: test
    assert len(load_prompts(f"{tmp_path / 'dd'}@train")) == 2
    assert len(load_prompts(f"{tmp_path / 'dd'}@train", limit=1)) == 1
    with pytest.raises(PromptSourceError, match="no split 'dev'.*available splits"):
        load_prompts(f"{tmp_path / 'dd'}@dev")


def test_hub_error_is_wrapped(monkeypatch):
    datasets = pytest.importorskip("datasets")

    def fail(*args, **kwargs):
        raise ConnectionError("offline\nmore detail")

    monkeypatch.setattr(datasets, "load_dataset", fail)
    with pytest.raises(PromptSourceError, match=r"^hf:org/name:cfg@test: could not load the dataset "
                                                r"\(ConnectionError: offline\); check") as err:
        load_prompts("hf:org/name:cfg@test")
    assert "\n" not in str(err.value)


def test_missing_optional_dependencies(tmp_path, monkeypatch):
    (tmp_path / "x.parquet").write_bytes(b"")
    (tmp_path / "saved").mkdir()
    (tmp_path / "saved" / "state.json").write_text("{}")
    monkeypatch.setitem(sys.modules, "datasets", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(PromptSourceError, match="pip install datasets"):
        load_prompts("hf:foo")
    with pytest.raises(PromptSourceError, match="pip install datasets"):
        load_prompts(str(tmp_path / "saved"))
    with pytest.raises(PromptSourceError, match="pip install pyarrow"):
        load_prompts(str(tmp_path / "x.parquet"))


# ---------------------------------------------------------------- file errors

def error_for(tmp_path, name, content, **kw) -> str:
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(PromptSourceError) as err:
        load_prompts(str(path), **kw)
    msg = str(err.value)
    assert "\n" not in msg
    return msg


def test_file_errors(tmp_path):
    ok = json.dumps({"prompt": "hi"})
    with pytest.raises(PromptSourceError, match="no such file"):
        load_prompts(str(tmp_path / "nope.jsonl"))
    assert "no records" in error_for(tmp_path, "empty.jsonl", "\n  \n")
    assert "no records" in error_for(tmp_path, "empty.json", "[]")
    assert "no records" in error_for(tmp_path, "blank.json", "")
    msg = error_for(tmp_path, "bad.jsonl", f"{ok}\n\n{{\"prompt\": \"x\" oops}}\n")
    assert msg.startswith("bad.jsonl line 3: not valid JSON (") and "fix or delete that line" in msg
    msg = error_for(tmp_path, "fields.jsonl", f'{ok}\n{{"text": "x"}}\n')
    assert msg.startswith("fields.jsonl line 2: record has none of the accepted fields")
    assert "'messages'" in msg and "'prompt'" in msg and "'context' + 'question'" in msg and "['text']" in msg
    assert "no 'question'" in error_for(tmp_path, "half.jsonl", '{"context": "x"}')
    msg = error_for(tmp_path, "shape.jsonl", f'{ok}\n{ok}\n{{"messages": "hello"}}\n')
    assert msg.startswith("shape.jsonl line 3: 'messages' has the wrong shape")
    msg = error_for(tmp_path, "shape.json", json.dumps([{"prompt": "a"}, {"messages": [{"role": "user"}]}]))
    assert msg.startswith("shape.json index 1: 'messages' item 0 has the wrong shape")
    assert "expected a JSON object" in error_for(tmp_path, "scalar.jsonl", '"just a string"')
    assert "duplicate id 'a'" in error_for(tmp_path, "dup.jsonl", '{"id": "a", "prompt": "x"}\n{"id": "a", "prompt": "y"}')
    assert "unknown metric" in error_for(tmp_path, "metric.jsonl", '{"prompt": "x", "metric": "bleu"}')
    assert "'prompt' must be a string" in error_for(tmp_path, "type.jsonl", '{"prompt": 3}')
    assert "expected a list of objects" in error_for(tmp_path, "obj.json", '{"rows": []}')
    assert "unsupported file type '.csv'" in error_for(tmp_path, "data.csv", "a,b")
    assert "limit=0" in error_for(tmp_path, "lim.jsonl", ok, limit=0)
    (tmp_path / "folder").mkdir()
    with pytest.raises(PromptSourceError, match="not a saved dataset"):
        load_prompts(str(tmp_path / "folder"))


def test_a_mixture_takes_each_sources_count_and_shuffles_them_into_one_stream(tmp_path):
    rows = [{"id": f"f{i}", "prompt": f"question {i}"} for i in range(5)]
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    spec = [{"data": f"builtin:n=4,{SMALL},tasks=needle+kv_lookup,seed=1", "count": 3},
            {"data": str(path), "count": 2}, f"builtin:n=2,{SMALL},seed=2"]
    records = load_prompts(spec, tokenizer=WhitespaceTokenizer())
    alone = load_prompts(f"builtin:n=4,{SMALL},tasks=needle+kv_lookup,seed=1", tokenizer=WhitespaceTokenizer())
    assert len(records) == 7
    by_source = Counter(r.meta["mixture_source"] for r in records)
    assert by_source == {spec[0]["data"]: 3, str(path): 2, spec[2]: 2}
    assert {r.id for r in records if r.meta["mixture_source"] == str(path)} == {"f0", "f1"}  # the first N
    assert {r.id for r in records if r.meta["mixture_source"] == spec[0]["data"]} == {r.id for r in alone[:3]}
    again = load_prompts(spec, tokenizer=WhitespaceTokenizer())
    assert [r.id for r in again] == [r.id for r in records]  # seeded
    assert [r.id for r in load_prompts(spec, tokenizer=WhitespaceTokenizer(), seed=5)] != [r.id for r in records]
    assert [r.id for r in load_prompts(spec, tokenizer=WhitespaceTokenizer(), limit=4)] == [r.id for r in records[:4]]


@pytest.mark.parametrize("spec,message", [
    ([], "empty mixture"),
    ([{"data": "builtin:n=2", "count": 0}], "count"),
    ([{"data": "builtin:n=2", "weight": 2}], "is not a source"),
    ([{"data": f"builtin:n=2,{SMALL}", "count": 3}], "fewer than its count 3"),
    ([f"builtin:n=2,{SMALL}", f"builtin:n=3,{SMALL}"], "comes from two sources"),
])
def test_bad_mixtures_fail_with_one_line(spec, message):
    with pytest.raises(PromptSourceError, match=message):
        load_prompts(spec, tokenizer=WhitespaceTokenizer())


def test_collect_config_takes_a_mixture_from_a_recipe():
    from lkvcli.collect import CollectConfig
    from lkvcli.config import from_dict

    config = from_dict(CollectConfig, {"data": [{"data": "builtin:n=2", "count": 1}, {"data": "x.jsonl"}]})
    assert config.data == [{"data": "builtin:n=2", "count": 1}, {"data": "x.jsonl"}]
    assert from_dict(CollectConfig, {"data": "builtin:n=2"}).data == "builtin:n=2"


# ---------------------------------------------------------------- text domains and the newer task families

def domain_prompts(task, texts, n=4):
    return load_prompts(f"builtin:n={n},{SMALL},tasks={task},texts={texts},seed=5", tokenizer=WhitespaceTokenizer())


def check_critical(r: PromptRecord):
    for span in r.meta["critical_chars"]:
        assert r.context[span["chars"][0]:span["chars"][1]] == span["text"]


@pytest.mark.parametrize("texts", ["code", "docs"])
def test_code_and_docs_haystacks_are_slices_of_installed_texts(texts):
    from lkvcli.prompts.corpus import load_documents

    documents = {d.file: d for d in load_documents(texts)}
    for r in domain_prompts("summarise+explain+list", texts, n=6):
        check_layout(r)
        hay = r.meta["haystack"]
        assert r.meta["domain"] == hay["domain"] == texts and f"-{texts}-" in r.id
        doc = documents[hay["file"]]
        assert r.context.split("\n")[0] == doc.lines[hay["start_line"] - 1]
        assert r.context in "\n".join(doc.lines)
        if texts == "code":
            assert doc.lines[hay["start_line"] - 1].startswith(("def ", "class "))
            if r.task == "list":
                assert r.meta["definitions"] and all(f"\n{kind} {name}" in "\n" + r.context for name in
                                                     r.meta["definitions"] for kind in ("def", "class")
                                                     if f"\n{kind} {name}" in "\n" + r.context)


@pytest.mark.parametrize("texts", ["plays", "code", "docs"])
def test_passage_qa_asks_about_a_fact_of_the_passage_and_marks_it(texts):
    for r in domain_prompts("passage_qa", texts, n=5):
        check_layout(r)
        check_critical(r)
        (span,) = r.meta["critical_chars"]
        assert r.answer and span["text"] == r.answer and r.metric == "contains_all"
        quoted = re.search(r'[`"](.+)[`"]\?', r.question).group(1)
        if texts == "docs":
            line = next(x for x in r.context.split("\n") if x.strip() == quoted.replace("____", r.answer))
            assert r.context.count(line) == 1
        else:
            assert r.context.count(quoted) == 1  # the quoted line identifies one place


def test_multi_kv_asks_keys_that_have_near_duplicate_distractors():
    for r in builtin("multi_kv", n=4):
        check_layout(r)
        check_critical(r)
        pairs = dict(re.findall(r'^ "([0-9a-f]{8}-[0-9a-f]{4})": "([0-9a-f]{8}-[0-9a-f]{4})"', r.context, re.M))
        assert len(pairs) == r.meta["n_pairs"] and 2 <= len(r.meta["keys"]) <= 3
        assert r.answer == [pairs[k] for k in r.meta["keys"]]
        for key, near in zip(r.meta["keys"], r.meta["distractors"]):
            assert near in pairs and near != key and near[:-4] == key[:-4] and f'"{key}"' in r.question


def test_chat_requests_name_someone_of_the_passage_in_its_domains_register():
    from lkvcli.prompts.text_tasks import CHAT_REQUESTS

    records = load_prompts("builtin:n=30,min_tokens=200,max_tokens=400,tasks=chat,texts=all,seed=3")
    assert {r.meta.get("domain", "plays") for r in records} == {"plays", "code", "docs"}
    named = 0
    for r in records:
        domain = r.meta.get("domain", "plays")
        assert r.task == "chat" and r.metric == "agreement" and r.answer is None and "critical_chars" not in r.meta
        assert len(r.context.split()) < 400  # short: the range asked for, in words at most
        request = next(q for q in CHAT_REQUESTS[domain]
                       if re.fullmatch(re.escape(q).replace(r"\{speaker\}", "(.+)").replace(r"\{name\}", "(.+)"),
                                       r.question))
        if "{" in request:
            name = re.fullmatch(re.escape(request).replace(r"\{speaker\}", "(.+)").replace(r"\{name\}", "(.+)"),
                                r.question).group(1)
            pattern = rf"^{re.escape(name)}\.?$" if domain == "plays" else rf"^(def|class) {re.escape(name)}\b"
            assert re.search(pattern, r.context, re.M), (r.id, name)
            named += 1
    assert named  # the seeded choice reached the requests that name someone


def test_counting_answer_is_the_sum_of_the_teams_reports():
    for r in builtin("counting", n=4):
        check_layout(r)
        check_critical(r)
        key = r.meta["key"]
        found = [int(n) for n in re.findall(rf"^Report: the {key} team found (\d+) \w+\.$", r.context, re.M)]
        assert sorted(found) == sorted(r.meta["counts"]) and r.answer == str(sum(found))
        assert len(r.meta["critical_chars"]) == len(found)
        assert r.meta["distractors"] and all(k != key for k, _ in r.meta["distractors"])


def test_default_tasks_are_the_original_eight_and_texts_are_checked():
    default = load_prompts(f"builtin:n=16,{SMALL}")
    assert {r.task for r in default} == {"needle", "multi_needle", "kv_lookup", "var_tracking", "freq_words",
                                         "summarise", "explain", "list"}
    assert all("domain" not in r.meta for r in default)
    every = load_prompts(f"builtin:n=33,{SMALL},tasks=all,texts=all")
    assert {r.task for r in every} == set(TASKS) and {r.meta["domain"] for r in every if "domain" in r.meta} == \
        {"code", "docs"}
    with pytest.raises(PromptSourceError, match="unknown text domain 'poems'"):
        load_prompts("builtin:texts=plays+poems")
