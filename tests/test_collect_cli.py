"""`lkv collect` through the CLI: end to end on a tiny model, resume, shards, and every bad input."""

import json

import pytest
from helpers import lkv, one_line_error, tiny_llama_folder

from lkvcli.targets import TargetsReader


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return tiny_llama_folder(tmp_path_factory.mktemp("tiny") / "model", max_positions=160)


def write_jsonl(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


ROWS = [{"id": "a", "prompt": "Name a colour."}, {"id": "b", "context": "Tom has a red hat.", "question": "What colour?",
                                                  "answer": "red"},
        {"id": "c", "messages": [{"role": "user", "content": "Say hi."}]}]


def test_collect_end_to_end_then_resume(tiny_dir, tmp_path):
    data = write_jsonl(tmp_path / "p.jsonl", ROWS)
    out = tmp_path / "t"
    r = lkv("--json", "collect", "--model", tiny_dir, "--data", data, "--out", out, "--max-new-tokens", 4)
    assert r.exit_code == 0, r.output
    reader = TargetsReader(out)
    assert sorted(reader.ids()) == ["a", "b", "c"]
    rec = reader[reader.ids().index("b")]
    assert rec.meta["answer"] == "red" and rec.meta["question"] == "What colour?"
    assert rec.target.shape == (2, 2, rec.prompt_len)
    assert rec.meta["prompt_text"].startswith("<|im_start|>")
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["settings"]["max_new_tokens"] == 4 and manifest["model"]["fingerprint"]["weights"]

    before = (out / "records.jsonl").read_text()
    write_jsonl(data, ROWS + [{"id": "d", "prompt": "One more."}])
    r = lkv("--json", "collect", "--model", tiny_dir, "--data", data, "--out", out, "--max-new-tokens", 4)
    assert r.exit_code == 0, r.output
    summary = json.loads(r.stdout[r.stdout.index("{"):])
    assert summary["already_done"] == 3 and summary["written"] == 1
    after = (out / "records.jsonl").read_text()
    assert after.startswith(before) and len(after.splitlines()) == 4


def test_shards_split_the_prompts_and_read_as_one(tiny_dir, tmp_path):
    data = write_jsonl(tmp_path / "p.jsonl", ROWS)
    for i in range(2):
        r = lkv("collect", "--model", tiny_dir, "--data", data, "--out", tmp_path / "o", "--max-new-tokens", 2,
                "--num-shards", 2, "--shard-index", i)
        assert r.exit_code == 0, r.output
    assert len(TargetsReader(tmp_path / "o" / "shard-0-of-2")) == 2
    assert sorted(TargetsReader(tmp_path / "o").ids()) == ["a", "b", "c"]


def test_missing_file(tiny_dir, tmp_path):
    one_line_error(lkv("collect", "--model", tiny_dir, "--data", tmp_path / "nope.jsonl", "--out", tmp_path / "t"),
                   "nope.jsonl")


def test_empty_dataset(tiny_dir, tmp_path):
    (tmp_path / "e.jsonl").write_text("")
    one_line_error(lkv("collect", "--model", tiny_dir, "--data", tmp_path / "e.jsonl", "--out", tmp_path / "t"),
                   "no records")


def test_malformed_line_reports_its_number(tiny_dir, tmp_path):
    data = write_jsonl(tmp_path / "p.jsonl", [ROWS[0], ROWS[1], '{"prompt": "broken'])
    one_line_error(lkv("collect", "--model", tiny_dir, "--data", data, "--out", tmp_path / "t"), "line 3")


def test_record_without_accepted_fields(tiny_dir, tmp_path):
    data = write_jsonl(tmp_path / "p.jsonl", [ROWS[0], {"text": "what field is this?"}])
    one_line_error(lkv("collect", "--model", tiny_dir, "--data", data, "--out", tmp_path / "t"), "line 2", "prompt")


def test_prompt_longer_than_context_is_skipped_or_fails_with_strict(tiny_dir, tmp_path):
    data = write_jsonl(tmp_path / "p.jsonl", [ROWS[0], {"id": "long", "prompt": "word " * 400}])
    r = lkv("--json", "collect", "--model", tiny_dir, "--data", data, "--out", tmp_path / "t", "--max-new-tokens", 2)
    assert r.exit_code == 0, r.output
    summary = json.loads(r.stdout[r.stdout.index("{"):])
    assert summary["written"] == 1 and summary["skipped_too_long"] == 1
    r = lkv("collect", "--model", tiny_dir, "--data", data, "--out", tmp_path / "t2", "--max-new-tokens", 2, "--strict")
    one_line_error(r, "long", "context")


def test_unknown_model_name(tmp_path):
    data = write_jsonl(tmp_path / "p.jsonl", ROWS)
    one_line_error(lkv("collect", "--model", "no-such-model", "--data", data, "--out", tmp_path / "t"),
                   "unknown model", "smollm2-135m-instruct")


def test_folder_from_another_model_is_refused_and_kept(tiny_dir, tmp_path):
    data = write_jsonl(tmp_path / "p.jsonl", ROWS[:1])
    out = tmp_path / "t"
    assert lkv("collect", "--model", tiny_dir, "--data", data, "--out", out, "--max-new-tokens", 2).exit_code == 0
    snapshot = {p.name: p.read_bytes() for p in out.iterdir()}
    other = tiny_llama_folder(tmp_path / "other", seed=5, max_positions=160)
    one_line_error(lkv("collect", "--model", other, "--data", data, "--out", out), "another model", "--overwrite")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == snapshot
    r = lkv("collect", "--model", other, "--data", data, "--out", out, "--max-new-tokens", 2, "--overwrite")
    assert r.exit_code == 0, r.output


def test_bad_option_values(tiny_dir, tmp_path):
    data = write_jsonl(tmp_path / "p.jsonl", ROWS)
    one_line_error(lkv("collect", "--model", tiny_dir, "--data", data, "--reduction", "median"), "reduction")
    one_line_error(lkv("collect", "--data", data, "--num-shards", 2, "--shard-index", 2), "shard_index")
    one_line_error(lkv("collect", "--data", data, "bogus_field=1"), "unknown field", "bogus_field")


def test_launcher_environment_sets_the_shard():
    from lkvcli.collect import CollectConfig

    config = CollectConfig(device="cpu")
    config.apply_launcher_env({"WORLD_SIZE": "4", "RANK": "2", "LOCAL_RANK": "0"})
    assert (config.num_shards, config.shard_index) == (4, 2)
    assert str(config.out_folder()).endswith("shard-2-of-4")
    explicit = CollectConfig(num_shards=2, shard_index=1)
    explicit.apply_launcher_env({"WORLD_SIZE": "4", "RANK": "2"})
    assert (explicit.num_shards, explicit.shard_index) == (2, 1)


def test_collect_a_mixture_from_a_recipe_and_a_bad_one(tiny_dir, tmp_path):
    a = write_jsonl(tmp_path / "a.jsonl", ROWS)
    b = write_jsonl(tmp_path / "b.jsonl", [{"id": f"b{i}", "prompt": f"Count to {i}."} for i in range(4)])
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"collect:\n  data:\n    - {{data: {a}, count: 2}}\n    - {{data: {b}}}\n  max_new_tokens: 3\n")
    out = tmp_path / "t"
    r = lkv("collect", recipe, "--model", tiny_dir, "--out", out)
    assert r.exit_code == 0, r.output
    reader = TargetsReader(out)
    assert sorted(reader.ids()) == ["a", "b", "b0", "b1", "b2", "b3"]
    assert {reader.meta(i)["id"]: reader.meta(i)["extra"].get("mixture_source") for i in range(len(reader))}["b2"] == str(b)
    recipe.write_text(f"collect:\n  data:\n    - {{data: {a}, count: 9}}\n")
    one_line_error(lkv("collect", recipe, "--model", tiny_dir, "--out", tmp_path / "t2"), "fewer than its count 9")
