"""Mixture sources that map a dataset's own columns onto lkv's fields (prompts/mapping.py), on rows
shaped like the published datasets the real-model recipes name."""

from __future__ import annotations

import json

import pytest

from lkvcli.prompts import PromptSourceError, load_prompts

# Row shapes as the datasets document them (dataset cards / dataset_info features)
TULU = [{"id": f"t{i}", "source": "oasst", "messages": [{"role": "user", "content": f"Hi {i}?"},
                                                        {"role": "assistant", "content": f"Hello {i}."}]}
        for i in range(3)]
CHATQA2 = [{"question": f"User: Passage {i} about owls.\n\nQ: What is passage {i} about?\n\nAssistant:",
            "answer": f"Owls ({i}).", "word count": 4} for i in range(3)]
GSM8K = [{"question": f"What is {i} + {i}?", "answer": f"{i} + {i} = {2 * i}.\n#### {2 * i}"} for i in range(5)]
ARC = [{"id": f"a{i}", "question": f"Which is {i}?", "choices": {"text": ["x", "y"], "label": ["A", "B"]},
        "answerKey": "B"} for i in range(3)]
STACK = [{"content": f"def f{i}():\n    return {i}\n", "lang": "Python", "size": 20} for i in range(2)]


def write(tmp_path, name, rows):
    path = tmp_path / f"{name}.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_sft_messages_drop_the_reference_reply_and_keep_it(tmp_path):
    records = load_prompts([{"data": write(tmp_path, "tulu", TULU), "count": 2}])
    assert sorted(r.id for r in records) == ["t0", "t1"]
    one = next(r for r in records if r.id == "t1")
    assert one.messages == [{"role": "user", "content": "Hi 1?"}] and one.meta["reference"] == "Hello 1."


def test_extract_takes_the_prompt_out_of_a_wrapped_question_column(tmp_path):
    entry = {"data": write(tmp_path, "chatqa2", CHATQA2), "count": 3, "columns": {"reference": "answer"},
             "extract": {"question": r"^(User: )?(?P<prompt>.*?)(\s*Assistant:)?\s*$"}}
    records = sorted(load_prompts([entry]), key=lambda r: r.id)
    assert records[0].messages == [{"role": "user", "content": "Passage 0 about owls.\n\nQ: What is passage 0 about?"}]
    assert records[0].answer is None and records[0].metric == "agreement"  # the long reply is a reference only
    assert records[0].meta["reference"] == "Owls (0)." and records[0].context is None


def test_fixed_shots_come_from_the_first_rows_and_extract_sets_the_answer(tmp_path):
    entry = {"data": write(tmp_path, "gsm8k", GSM8K), "count": 2, "shots": 2,
             "extract": {"answer": r"^(?P<solution>.*?)\s*####\s*(?P<answer>\S+)\s*$"},
             "shot_template": "Question: {question}\nAnswer: {solution} #### {answer}",
             "template": "Question: {question}\nAnswer:"}
    records = sorted(load_prompts([entry]), key=lambda r: r.id)
    assert len(records) == 2  # rows 2 and 3: rows 0 and 1 are the examples, row 4 is past the count
    prompt = records[0].messages[0]["content"]
    assert prompt == ("Question: What is 0 + 0?\nAnswer: 0 + 0 = 0. #### 0\n\n"
                      "Question: What is 1 + 1?\nAnswer: 1 + 1 = 2. #### 2\n\n"
                      "Question: What is 2 + 2?\nAnswer:")
    assert [r.answer for r in records] == ["4", "6"] and records[0].metric == "contains_all"


def test_templates_reach_into_nested_columns(tmp_path):
    entry = {"data": write(tmp_path, "arc", ARC), "columns": {"answer": "answerKey"},
             "template": "{question}\n{choices[label][0]}. {choices[text][0]}\n{choices[label][1]}. {choices[text][1]}"}
    records = load_prompts([entry])
    a1 = next(r for r in records if r.id == "a1")
    assert a1.messages[0]["content"] == "Which is 1?\nA. x\nB. y" and a1.answer == "B"
    code = load_prompts([{"data": write(tmp_path, "stack", STACK), "template": "{content}\nExplain this code."}])
    assert sorted(r.messages[0]["content"] for r in code)[1] == "def f1():\n    return 1\n\nExplain this code."
    assert code[0].meta["lang"] == "Python"


def test_a_saved_dataset_maps_its_rows_and_counts_after_the_shots(tmp_path):
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_list(GSM8K).save_to_disk(str(tmp_path / "gsm8k"))
    entry = {"data": str(tmp_path / "gsm8k"), "count": 3, "shots": 1, "template": "Q: {question}",
             "shot_template": "Q: {question}\nA: {answer}"}
    records = load_prompts([entry])
    assert len(records) == 3 and all(r.messages[0]["content"].startswith("Q: What is 0 + 0?\nA: 0 + 0") for r in records)


@pytest.mark.parametrize("extra, message", [
    ({"columns": {"context": "document"}}, "no column 'document' (mapped to 'context')"),
    ({"template": "{code}"}, "no column 'code' in the row"),
    ({"template": "plain text"}, "names no column"),
    ({"template": "{question"}, "not a valid format string"),
    ({"shots": 2, "template": "{question}"}, "needs a shot_template"),
    ({"shots": -1}, "must be a non-negative integer"),
    ({"extract": {"answer": "####"}}, "has no named group"),
    ({"extract": {"answer": "(?P<x>^zzz)"}}, "does not match extract pattern"),
    ({"colums": {}}, "is not a source"),
])
def test_bad_mappings_fail_with_one_line_naming_the_fix(tmp_path, extra, message):
    with pytest.raises(PromptSourceError, match=message.replace("(", r"\(").replace(")", r"\)")) as err:
        load_prompts([{"data": write(tmp_path, "gsm8k", GSM8K), **extra}])
    assert "\n" not in str(err.value)


def test_builtin_sources_take_no_mapping():
    with pytest.raises(PromptSourceError, match="apply to files and datasets"):
        load_prompts([{"data": "builtin:n=2", "template": "{question}"}])


def test_a_mixture_file_is_the_same_mixture_as_the_list(tmp_path):
    import yaml

    entries = [{"data": write(tmp_path, "tulu", TULU), "count": 2},
               {"data": write(tmp_path, "stack", STACK), "template": "{content}\nExplain this code."}]
    path = tmp_path / "mix.yaml"
    path.write_text(yaml.safe_dump(entries))
    assert load_prompts(str(path)) == load_prompts(entries)
    (tmp_path / "bad.yaml").write_text("data: x\n")
    with pytest.raises(PromptSourceError, match="holds a YAML list of sources"):
        load_prompts(str(tmp_path / "bad.yaml"))
    with pytest.raises(PromptSourceError, match="no such mixture file"):
        load_prompts(str(tmp_path / "missing.yml"))
    (tmp_path / "broken.yaml").write_text("- {data: x\n")
    with pytest.raises(PromptSourceError, match="broken.yaml line 2: not valid YAML"):
        load_prompts(str(tmp_path / "broken.yaml"))
