"""Recorded targets equal an independent computation from eager attention (output_attentions=True)."""

import pytest
import torch
from helpers import eager_attention
from tiny_models import ARCHS, TinyTokenizer, tiny_fingerprint, tiny_model

from lkvcli.collect import ground_truth
from lkvcli.targets import TargetsReader, TargetsWriter, new_manifest


def eager_reference(model, prompt_ids, response_ids, reduction="mean"):
    """Teacher-forced eager pass on prompt+response: the response queries over the prompt keys."""
    full = torch.cat([prompt_ids, torch.tensor([response_ids])], dim=1)
    return eager_attention(model, full, prompt_ids.shape[1], prompt_ids.shape[1], reduction)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("reduction", ["mean", "max"])
def test_recorded_targets_match_eager_attention(arch, reduction, tmp_path):
    model = tiny_model(arch, seed=1)
    torch.manual_seed(2)
    prompt_ids = torch.randint(0, 100, (1, 29))  # longer than gemma3's sliding window of 8
    response, target, reason = ground_truth(model, prompt_ids, max_new_tokens=9, stop_ids=set(), reduction=reduction)
    assert reason == "length" and len(response) == 9

    settings = {"max_new_tokens": 9, "reduction": reduction, "storage": "dense", "storage_dtype": "float32",
                "chat_template": "none"}
    manifest = new_manifest("tiny", tiny_fingerprint(model), settings, model.config.num_hidden_layers,
                            model.config.num_key_value_heads)
    writer = TargetsWriter(tmp_path / "t", manifest)
    writer.add({"id": "r0"}, prompt_ids[0], torch.tensor(response), target)
    writer.close()
    record = TargetsReader(tmp_path / "t")[0]

    ref = eager_reference(model, prompt_ids, response, reduction)
    assert record.target.shape == (model.config.num_hidden_layers, model.config.num_key_value_heads, 29)
    assert torch.equal(record.response_ids, torch.tensor(response))
    assert (record.target - ref).abs().max().item() < 1e-5
    assert torch.allclose(record.target.sum(-1), torch.ones(record.target.shape[:2]), atol=1e-5)


def test_gemma3_sliding_layers_ignore_keys_outside_the_window():
    model = tiny_model("gemma3", seed=0)
    prompt_ids = torch.randint(0, 100, (1, 40))
    _, target, _ = ground_truth(model, prompt_ids, max_new_tokens=3, stop_ids=set())
    window = model.config.sliding_window
    # sliding layers: the first response query (slot 40) sees only keys > 40 - window
    assert target[0, :, : 40 - window + 1].abs().max() == 0
    assert target[0, :, 40 - window + 1 :].sum() > 0
    assert target[2, :, :10].sum() > 0  # the full-attention layer sees the start of the prompt


def test_stop_token_is_not_part_of_the_response():
    model = tiny_model("llama", seed=3)
    prompt_ids = torch.randint(0, 100, (1, 12))
    free, _, _ = ground_truth(model, prompt_ids, max_new_tokens=6, stop_ids=set())
    stopped, target, reason = ground_truth(model, prompt_ids, max_new_tokens=6, stop_ids={free[3]})
    first = free.index(free[3])
    assert reason == "stop" and stopped == free[:first]
    if stopped:
        ref = eager_reference(model, prompt_ids, stopped)
        assert (target - ref).abs().max() < 1e-5


def test_fingerprint_is_stable_across_dtypes_and_differs_across_weights():

    from lkvcli.models import fingerprint, same_model

    a = tiny_model("llama", seed=0)
    fp32 = fingerprint(a, TinyTokenizer())
    bf16 = fingerprint(a.to(torch.bfloat16), TinyTokenizer())
    assert same_model(fp32, bf16)
    assert not same_model(fp32, fingerprint(tiny_model("llama", seed=1), TinyTokenizer()))
