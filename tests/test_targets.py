"""The targets folder: round trips, compact storage, resume after a crash, refusals."""

import json

import pytest
import torch

from lkvcli.errors import LkvError
from lkvcli.targets import RECORDS, TargetsReader, TargetsWriter, densify, new_manifest, sparsify

FP = {"model_type": "llama", "config": "c1", "tokenizer": "t1", "weights": "w1", "chat_template": "x"}
SETTINGS = {"max_new_tokens": 8, "reduction": "mean", "storage": "dense", "storage_dtype": "float16",
            "chat_template": "x"}


def manifest(fp=FP, **settings):
    return new_manifest("m", fp, {**SETTINGS, **settings}, 3, 2)


def random_target(L, seed=0, layers=3, heads=2):
    g = torch.Generator().manual_seed(seed)
    t = torch.rand(layers, heads, L, generator=g) ** 4
    return t / t.sum(-1, keepdim=True)


def write(folder, n, start=0, **settings):
    w = TargetsWriter(folder, manifest(**settings), records_per_file=2)
    for i in range(start, start + n):
        w.add({"id": f"r{i}", "task": "needle"}, torch.arange(10 + i), torch.arange(3), random_target(10 + i, i))
    w.close()
    return w


def test_dense_float16_round_trip(tmp_path):
    write(tmp_path / "t", 3)
    reader = TargetsReader(tmp_path / "t")
    assert reader.ids() == ["r0", "r1", "r2"]
    rec = reader[2]
    assert rec.prompt_len == 12 and rec.meta["task"] == "needle"
    ref = random_target(12, 2)
    assert torch.allclose(rec.target, ref, rtol=2e-3, atol=1e-6)
    assert torch.allclose(rec.target.sum(-1), torch.ones(3, 2))


def test_sparse_form_keeps_the_mass_and_reads_back_dense(tmp_path):
    target = random_target(500, 7)
    parts = sparsify(target, 0.99)
    dense = densify(parts["indices"], parts["values"], parts["offsets"], target.shape)
    kept = dense.sum(-1)
    assert (kept >= 0.99 - 1e-6).all()
    assert parts["indices"].numel() < target.numel()  # smaller than dense
    # the kept entries are the largest ones of each row
    row_min_kept = torch.where(dense > 0, dense, torch.inf).amin(-1)
    row_max_dropped = torch.where(dense == 0, target, -torch.inf).amax(-1)
    assert (row_min_kept >= row_max_dropped).all()

    capped = sparsify(target, 0.99, top_k=50)
    assert (capped["offsets"][1:] - capped["offsets"][:-1]).max() == 50
    assert capped["indices"].dtype == torch.int16

    w = TargetsWriter(tmp_path / "s", manifest(storage="sparse", sparse_mass=0.99))
    w.add({"id": "a"}, torch.arange(500), torch.arange(4), target)
    w.close()
    rec = TargetsReader(tmp_path / "s")[0]
    assert torch.allclose(rec.target.sum(-1), torch.ones(3, 2))
    assert (rec.target - target).abs().max() < 0.02


def test_resume_never_duplicates_and_repairs_a_partial_line(tmp_path):
    folder = tmp_path / "t"
    write(folder, 3)
    with open(folder / RECORDS, "a") as fh:  # a crash in the middle of an append
        fh.write('{"id": "r9", "fi')
    w = TargetsWriter(folder, manifest(), records_per_file=2)
    assert w.done_ids == {"r0", "r1", "r2"}
    with pytest.raises(LkvError, match="already"):
        w.add({"id": "r1"}, torch.arange(4), torch.arange(2), random_target(4))
    w.add({"id": "r3"}, torch.arange(4), torch.arange(2), random_target(4))
    w.close()
    lines = (folder / RECORDS).read_text().splitlines()
    assert [json.loads(x)["id"] for x in lines] == ["r0", "r1", "r2", "r3"]
    assert len(TargetsReader(folder)) == 4


def test_records_in_memory_are_flushed_on_close_and_files_are_not_overwritten(tmp_path):
    folder = tmp_path / "t"
    write(folder, 3)  # files 00000 (r0,r1) and 00001 (r2)
    before = (folder / "targets-00000.safetensors").read_bytes()
    write(folder, 1, start=3)
    assert (folder / "targets-00000.safetensors").read_bytes() == before
    assert sorted(p.name for p in folder.glob("targets-*")) == [f"targets-0000{i}.safetensors" for i in range(3)]
    assert not list(folder.glob("*.tmp"))


def test_folder_of_another_model_is_refused_unless_overwrite(tmp_path):
    folder = tmp_path / "t"
    write(folder, 2)
    other = {**FP, "weights": "w2"}
    with pytest.raises(LkvError, match="another model"):
        TargetsWriter(folder, manifest(other))
    w = TargetsWriter(folder, manifest(other), overwrite=True)
    assert w.done_ids == set()


def test_other_settings_are_refused(tmp_path):
    folder = tmp_path / "t"
    write(folder, 1)
    with pytest.raises(LkvError, match="max_new_tokens"):
        TargetsWriter(folder, new_manifest("m", FP, {**SETTINGS, "max_new_tokens": 9}, 3, 2))


def test_reader_joins_shard_folders(tmp_path):
    write(tmp_path / "out" / "shard-0-of-2", 2)
    write(tmp_path / "out" / "shard-1-of-2", 2, start=2)
    reader = TargetsReader(tmp_path / "out")
    assert sorted(reader.ids()) == ["r0", "r1", "r2", "r3"]
    assert len(TargetsReader([tmp_path / "out" / "shard-0-of-2", tmp_path / "out" / "shard-1-of-2"])) == 4


def test_reader_refuses_mixed_models_and_missing_folders(tmp_path):
    write(tmp_path / "a", 1)
    w = TargetsWriter(tmp_path / "b", manifest({**FP, "weights": "zz"}))
    w.close()
    with pytest.raises(LkvError, match="another model"):
        TargetsReader([tmp_path / "a", tmp_path / "b"])
    with pytest.raises(LkvError, match="not a targets folder"):
        TargetsReader(tmp_path / "missing")


def test_corrupt_shard_gives_a_clear_error(tmp_path):
    write(tmp_path / "t", 1)
    (tmp_path / "t" / "targets-00000.safetensors").write_bytes(b"garbage")
    with pytest.raises(LkvError, match="targets-00000.safetensors is damaged .*--repair"):
        TargetsReader(tmp_path / "t")[0]


def test_a_flipped_byte_names_the_file_and_repair_recollects_exactly_its_records(tmp_path):
    """Every shard's sha256 is in its records' lines; the reader names a damaged file and its records; `lkv
    collect --repair` drops them (and only them) and collects them again, equal to the first collection."""
    import json as _json

    from helpers import lkv, one_line_error
    from tiny_models import save_tiny_model

    model = save_tiny_model("llama", tmp_path / "model")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(_json.dumps({"id": f"p{i}", "prompt": f"item {i} " * 5}) + "\n" for i in range(6)))
    args = ["collect", "--model", model, "--data", prompts, "--out", tmp_path / "t", "--max-new-tokens", 3,
            "--device", "cpu", "records_per_file=2"]
    assert lkv(*args).exit_code == 0
    before = TargetsReader(tmp_path / "t")
    originals = {r.id: r for r in before}
    lines = [_json.loads(x) for x in (tmp_path / "t" / "records.jsonl").read_text().splitlines()]
    assert all(len(r["sha256"]) == 64 for r in lines)
    shard = tmp_path / "t" / lines[2]["file"]  # holds p2 and p3
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))
    with pytest.raises(LkvError) as err:
        list(TargetsReader(tmp_path / "t"))
    message = str(err.value)
    assert shard.name in message and "p2, p3" in message and "--repair" in message and "\n" not in message
    one_line_error(lkv("eval", "--targets", tmp_path / "t", "--methods", "snapkv", "--budgets", 4, "--parts",
                       "prediction", "--split", "all", "--out", tmp_path / "res", "--device", "cpu"), shard.name)
    r = lkv("--json", *args, "--repair")
    assert r.exit_code == 0, r.output
    summary = _json.loads(r.output[r.output.index("{"):])
    assert summary["repaired"] == 2 and summary["written"] == 2 and summary["already_done"] == 4
    after = TargetsReader(tmp_path / "t")
    assert sorted(after.ids()) == sorted(originals)
    for record in after:
        ref = originals[record.id]
        assert torch.equal(record.prompt_ids, ref.prompt_ids) and torch.equal(record.target, ref.target)
        assert all(torch.equal(record.extras[k], ref.extras[k]) for k in ref.extras)


def test_a_finished_record_is_durable_before_its_shard_is_written(tmp_path):
    """records_per_file=16: three finished records, then the process dies (no close): the next writer takes
    them up again (not to be collected again) and writes them, equal to an uninterrupted folder."""
    w = TargetsWriter(tmp_path / "t", manifest(), records_per_file=16)
    for i in range(3):
        w.add({"id": f"r{i}", "task": "needle"}, torch.arange(10 + i), torch.arange(3), random_target(10 + i, i))
    assert not (tmp_path / "t" / RECORDS).exists() or not (tmp_path / "t" / RECORDS).read_text()
    del w  # a crash: nothing flushed
    again = TargetsWriter(tmp_path / "t", manifest(), records_per_file=16)
    assert again.done_ids == {"r0", "r1", "r2"}
    again.add({"id": "r3", "task": "needle"}, torch.arange(13), torch.arange(3), random_target(13, 3))
    again.close()
    ref = TargetsWriter(tmp_path / "ref", manifest(), records_per_file=16)
    for i in range(4):
        ref.add({"id": f"r{i}", "task": "needle"}, torch.arange(10 + i), torch.arange(3), random_target(10 + i, i))
    ref.close()
    assert (tmp_path / "t" / "targets-00000.safetensors").read_bytes() == \
        (tmp_path / "ref" / "targets-00000.safetensors").read_bytes()
    assert (tmp_path / "t" / RECORDS).read_text() == (tmp_path / "ref" / RECORDS).read_text()
    assert not (tmp_path / "t" / "pending").exists() and not (tmp_path / "t" / "pending.jsonl").exists()
