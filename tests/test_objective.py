"""Training objectives: the max target against eager attention, the losses against hand computations,
and `lkv train` with objective.target / objective.loss / exclude_tasks."""

import pytest
import torch
from tiny_models import ARCHS, tiny_loaded, tiny_model, write_tiny_targets

from lkvcli.collect import CollectConfig, ground_truth_targets
from lkvcli.errors import LkvError
from lkvcli.lookahead import LookaheadConfig
from lkvcli.objective import ObjectiveConfig, kl_per_example, loss_per_example, record_row_weights, record_target
from lkvcli.targets import TargetsReader, TargetsWriter, new_manifest
from lkvcli.train import TrainConfig, train


def eager_rows(model, full: torch.Tensor, prompt_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Independent reference: the response queries' attention over the prompt keys from an eager pass,
    group mean per KV head, then (mean, max) over the queries, each renormalised."""
    model.set_attn_implementation("eager")
    try:
        with torch.no_grad():
            attentions = model(full, output_attentions=True).attentions
    finally:
        model.set_attn_implementation("lkv_sdpa")
    kv = model.config.num_key_value_heads
    means, maxes = [], []
    for a in attentions:
        a = a[0, :, prompt_len:, :prompt_len].double()
        a = a.view(kv, -1, *a.shape[1:]).mean(1)  # (kv, queries, keys)
        means.append(a.mean(1))
        maxes.append(a.amax(1))
    return tuple((lambda t: (t / t.sum(-1, keepdim=True)).float())(torch.stack(x)) for x in (means, maxes))


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("storage", ["dense", "sparse"])
def test_max_target_equals_eager_attention_and_round_trips(arch, storage, tmp_path):
    model = tiny_model(arch, seed=1)
    prompt = torch.randint(0, 100, (1, 27), generator=torch.Generator().manual_seed(5))
    tokens, found, _ = ground_truth_targets(model, prompt, 7, set(), extras=("max",))
    full = torch.cat([prompt, torch.tensor([tokens])], dim=1)
    mean_ref, max_ref = eager_rows(model, full, 27)
    # the last token is fed once more (feed_last): the reference covers every response token's query
    settings = {"max_new_tokens": 7, "reduction": "mean", "storage": storage, "storage_dtype": "float32",
                "chat_template": "none", "sparse_mass": 1.0, "sparse_top_k": None}
    writer = TargetsWriter(tmp_path / "t", new_manifest("tiny", {"weights": "x"}, settings,
                                                        model.config.num_hidden_layers,
                                                        model.config.num_key_value_heads))
    writer.add({"id": "r0"}, prompt[0], torch.tensor(tokens), found["mean"], extras={"max": found["max"]})
    writer.close()
    record = TargetsReader(tmp_path / "t")[0]
    assert record.meta["extra_targets"] == ["max"]
    assert (record.target - mean_ref).abs().max() < 1e-5
    assert (record.extras["max"] - max_ref).abs().max() < 1e-5
    assert not torch.allclose(record.extras["max"], record.target, atol=1e-3)  # a different quantity


def test_collect_settings_name_extra_targets_only_when_asked():
    assert CollectConfig().settings("t")["extra_targets"] == ["max"]
    assert "extra_targets" not in CollectConfig(extra_targets=[]).settings("t")  # what older folders hold


def test_losses_against_hand_computation():
    target = torch.tensor([0.5, 0.3, 0.2, 0.0], dtype=torch.float64).view(1, 1, 1, 4)
    pred = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64).view(1, 1, 1, 4)
    kl = sum(t * (torch.log(t) - torch.log(p)) for t, p in zip(target.flatten(), pred.flatten()) if t > 0)
    torch.testing.assert_close(loss_per_example(target, pred), kl.view(1))
    torch.testing.assert_close(kl_per_example(target, pred), kl.view(1))
    # listwise at T=1 is the KL; at T=2 both sides are square-rooted and renormalised
    torch.testing.assert_close(loss_per_example(target, pred, ObjectiveConfig(loss="listwise")), kl.view(1))
    ts, ps = target.sqrt() / target.sqrt().sum(), pred.sqrt() / pred.sqrt().sum()
    kl2 = sum(t * (torch.log(t) - torch.log(p)) for t, p in zip(ts.flatten(), ps.flatten()) if t > 0)
    torch.testing.assert_close(loss_per_example(target, pred, ObjectiveConfig(loss="listwise", temperature=2.0)),
                               kl2.view(1))
    # recall with budget 2: the cut is the prediction's 2nd largest entry (0.3); hinge by hand
    cut = torch.log(torch.tensor(0.3, dtype=torch.float64))
    hinge = sum(t * torch.nn.functional.softplus((cut - torch.log(p)) / 0.5)
                for t, p in zip(target.flatten(), pred.flatten()))
    got = loss_per_example(target, pred, ObjectiveConfig(loss="recall", budget=2, temperature=0.5, recall_weight=3.0))
    torch.testing.assert_close(got, (kl + 3.0 * hinge).view(1))


def test_recall_hinge_pushes_the_entries_below_the_cut_up():
    target = torch.tensor([0.05, 0.05, 0.9, 0.0]).view(1, 1, 1, 4)
    logits = torch.tensor([2.0, 1.5, -1.0, 0.5], requires_grad=True)
    pred = torch.softmax(logits, -1).view(1, 1, 1, 4)
    loss_per_example(target, pred, ObjectiveConfig(loss="recall", budget=1, recall_weight=1.0)).sum().backward()
    assert logits.grad[2] < 0 and logits.grad[2] == logits.grad.min()  # the target's big entry, ranked last


def test_record_target_mix_and_missing_max(tmp_path):
    folder = write_tiny_targets(tmp_path / "t", tiny_model("llama"), n=2, with_max=True)
    record = TargetsReader(folder)[0]
    mix = record_target(record, ObjectiveConfig(target="mix", mix=0.25))
    expected = 0.75 * record.target + 0.25 * record.extras["max"]
    torch.testing.assert_close(mix, expected / expected.sum(-1, keepdim=True))
    assert record_target(record, ObjectiveConfig(target="max")) is record.extras["max"]
    assert record_target(record, ObjectiveConfig(target="mean")) is record.target
    assert ObjectiveConfig().target == "max"  # the default, chosen on held-out answers (docs/training.md)
    record.extras = {}
    with pytest.raises(LkvError, match="extra_targets=max"):
        record_target(record, ObjectiveConfig(target="max"))
    for bad in (dict(mix=2.0), dict(temperature=0.0), dict(budget=0), dict(recall_weight=-1.0), dict(copy_weight=-0.1),
                dict(copy_boost=-1.0), dict(copy_head_weight=-1.0)):
        with pytest.raises(LkvError, match="objective"):
            ObjectiveConfig(**bad).validate()


def test_copy_weight_adds_mass_on_the_copied_prompt_tokens_of_live_rows(tmp_path):
    record = TargetsReader(write_tiny_targets(tmp_path / "t", tiny_model("llama"), n=1, with_max=True))[0]
    prompt = record.prompt_ids.tolist()
    record.response_ids = torch.tensor([7, *prompt[5:11], 7])  # copies prompt tokens 5..10: one run of 6
    record.extras["max"][0, 0] = 0  # an all-zero row (as in a sliding-window layer's) stays zero
    base = record_target(record, ObjectiveConfig(target="max"))
    got = record_target(record, ObjectiveConfig(target="max", copy_weight=0.5))
    copied = torch.zeros(record.prompt_len)
    copied[5:11] = 0.5 / 6
    expected = base + copied
    expected[0, 0] = 0
    torch.testing.assert_close(got, expected / expected.sum(-1, keepdim=True).clamp_min(1e-30))
    record.response_ids = torch.tensor([prompt[0], prompt[1], prompt[2]])  # no run of 4: the target is unchanged
    assert torch.equal(record_target(record, ObjectiveConfig(target="max", copy_weight=0.5)), base)


def test_copy_boost_multiplies_each_rows_mass_on_the_copied_tokens(tmp_path):
    record = TargetsReader(write_tiny_targets(tmp_path / "t", tiny_model("llama"), n=1, with_max=True))[0]
    prompt = record.prompt_ids.tolist()
    record.response_ids = torch.tensor([7, *prompt[5:11], 7])  # copies prompt tokens 5..10
    record.extras["max"][0, 0] = 0  # an all-zero row stays zero
    record.extras["max"][0, 1, 5:11] = 0  # a row that does not read the copied tokens keeps its target
    record.extras["max"][0, 1] /= record.extras["max"][0, 1].sum()
    base = record_target(record, ObjectiveConfig(target="max"))
    got = record_target(record, ObjectiveConfig(target="max", copy_boost=3.0))
    for layer in range(base.shape[0]):
        for head in range(base.shape[1]):
            row = [float(base[layer, head, i]) * (4.0 if 5 <= i < 11 else 1.0) for i in range(record.prompt_len)]
            total = sum(row)
            expected = torch.tensor([x / total if total else 0.0 for x in row])
            torch.testing.assert_close(got[layer, head], expected.to(got.dtype))
    torch.testing.assert_close(got[0, 1], base[0, 1])
    assert not got[0, 0].any()
    assert (got[1:, :, 5:11].sum(-1) > base[1:, :, 5:11].sum(-1)).all()  # every reading row puts more on them


def test_copy_head_weight_weighs_rows_by_their_mass_on_the_copied_tokens(tmp_path):
    record = TargetsReader(write_tiny_targets(tmp_path / "t", tiny_model("llama"), n=1, with_max=True))[0]
    prompt = record.prompt_ids.tolist()
    record.response_ids = torch.tensor([7, *prompt[5:11], 7])  # copies prompt tokens 5..10
    peak = record.extras["max"]
    assert torch.equal(record_row_weights(record, ObjectiveConfig(target="max")), torch.ones(peak.shape[:2]))  # off
    weights = record_row_weights(record, ObjectiveConfig(target="max", copy_head_weight=4.0))
    expected = torch.ones(peak.shape[:2])
    for layer in range(peak.shape[0]):
        for head in range(peak.shape[1]):
            expected[layer, head] += 4.0 * sum(float(peak[layer, head, i]) for i in range(5, 11))
    torch.testing.assert_close(weights, expected)
    assert weights.max() > 1.5  # the copied tokens carry mass in some rows: the check above is not all ones
    assert torch.equal(record_target(record, ObjectiveConfig(target="max", copy_head_weight=4.0)), peak)  # targets alone
    # the loss: each example's weighted mean of its rows' KL
    target = record.extras["max"][None]
    pred = torch.softmax(torch.randn(target.shape, generator=torch.Generator().manual_seed(3)), -1)
    kl = torch.xlogy(target, target).sum(-1) - (target * pred.log()).sum(-1)
    got = loss_per_example(target, pred, ObjectiveConfig(), weights[None])
    torch.testing.assert_close(got, ((kl[0] * weights).sum() / weights.sum()).view(1))


@pytest.fixture(scope="module")
def task_targets(tmp_path_factory):
    return write_tiny_targets(tmp_path_factory.mktemp("obj") / "t", tiny_model("llama"), n=12, with_max=True,
                              tasks=("needle", "kv_lookup", "summarise"))


def _config(data, out, **changes):
    values = dict(data=[str(data)], out=str(out), steps=6, batch_size=2, lr=1e-2, val_split=3, eval_every=0,
                  checkpoint_every=0, lookahead=LookaheadConfig(num_tokens=4))
    return TrainConfig(**{**values, **changes})


@pytest.mark.parametrize("objective", [ObjectiveConfig(target="max", loss="recall", budget=4),
                                       ObjectiveConfig(target="max", copy_weight=0.2),
                                       ObjectiveConfig(target="max", copy_head_weight=4.0),
                                       ObjectiveConfig(target="max", copy_boost=3.0),
                                       ObjectiveConfig(target="mix", loss="listwise", temperature=2.0)])
def test_training_under_other_objectives_lowers_their_loss(task_targets, tmp_path, objective):
    events = []
    summary = train(_config(task_targets, tmp_path / "run", objective=objective), loaded=tiny_loaded("llama"),
                    on_event=events.append)
    losses = [e.data["loss"] for e in events if e.kind == "advance"]
    assert losses[-1] < losses[0]
    assert summary["val_kl"] < summary["val_kl_start"]  # the validation KL (mean target) falls too


def test_exclude_tasks_holds_records_out(task_targets, tmp_path):
    import json

    summary = train(_config(task_targets, tmp_path / "run", exclude_tasks=["kv_lookup"], steps=2),
                    loaded=tiny_loaded("llama"))
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    reader = TargetsReader(task_targets)
    tasks = {m["id"]: m["task"] for m in (reader.meta(i) for i in range(len(reader)))}
    assert run["excluded_tasks"] == ["kv_lookup"] and run["train_records"] + len(run["val_ids"]) == 8
    assert all(tasks[i] != "kv_lookup" for i in run["val_ids"]) and summary["steps"] == 2
    with pytest.raises(LkvError, match="no record has task 'var_tracking'"):
        train(_config(task_targets, tmp_path / "r2", exclude_tasks=["var_tracking"]), loaded=tiny_loaded("llama"))


def test_train_records_takes_nested_subsets_and_keeps_the_validation_records(task_targets):
    from lkvcli.train.data import usable_split

    reader = TargetsReader(task_targets)
    full_train, full_val = usable_split(reader, _config(task_targets, "unused"))
    splits = {n: usable_split(reader, _config(task_targets, "unused", train_records=n)) for n in (2, 5, 100)}
    assert all(val == full_val for _, val in splits.values())
    assert [len(train) for train, _ in splits.values()] == [2, 5, len(full_train)]
    assert set(splits[2][0]) < set(splits[5][0]) < set(full_train)  # a learning curve's points are nested
    assert splits[100][0] == full_train
    with pytest.raises(LkvError, match="train_records"):
        _config(task_targets, "unused", train_records=0)


def test_max_objective_on_targets_without_max_fails_with_one_line(tmp_path):
    plain = write_tiny_targets(tmp_path / "t", tiny_model("llama"), n=6, with_max=False)
    with pytest.raises(LkvError, match="objective.target=max needs max targets"):
        train(_config(plain, tmp_path / "run", objective=ObjectiveConfig(target="max")), loaded=tiny_loaded("llama"))


@pytest.mark.parametrize("mode", ["context", "both"])
def test_context_mode_trains_on_the_context_and_its_renormalised_targets(tmp_path, mode):
    from tiny_models import save_tiny_model

    from lkvcli.lookahead import LookaheadAdapter
    from lkvcli.models import load_model

    folder = save_tiny_model("llama", tmp_path / "model")
    targets = write_tiny_targets(tmp_path / "t", load_model(str(folder), device="cpu").model, n=8, lengths=(18, 30),
                                 with_text=True)
    config = _config(targets, tmp_path / "run", mode=mode, steps=1, batch_size=1)
    summary = train(config, loaded=load_model(str(folder), device="cpu"))
    # independent reference: a fresh adapter (same seed) on a fresh model, the context being the words
    # before the question (write_tiny_targets puts the question in the prompt's last third)
    adapter = LookaheadAdapter.attach(load_model(str(folder), device="cpu").model, config.lookahead, seed=config.seed)
    reader = TargetsReader(targets)
    import json
    val_ids = set(json.loads((tmp_path / "run" / "run.json").read_text())["val_ids"])
    kls = []
    with torch.no_grad():
        for record in (reader[i] for i in range(len(reader)) if reader.ids()[i] in val_ids):
            cut = 2 * record.prompt_len // 3
            target = record.target[..., :cut] / record.target[..., :cut].sum(-1, keepdim=True)
            kls.append(kl_per_example(target[None], adapter.predict(record.prompt_ids[None, :cut])))
            if mode == "both":
                kls.append(kl_per_example(record.target[None], adapter.predict(record.prompt_ids[None])))
    assert len(kls) == (3 if mode == "context" else 6)
    assert abs(float(torch.cat(kls).mean()) - summary["val_kl_start"]) < 1e-5
