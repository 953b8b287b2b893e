"""The transformers-version layer: the cache keyword a model's forward takes, and the cache it returns."""

from types import SimpleNamespace

import torch
from tiny_models import tiny_model

from lkvcli.compat import cache_kwargs, output_cache


class OldForward(torch.nn.Module):  # transformers 5.2's signature
    def forward(self, input_ids=None, past_key_values=None, use_cache=None):
        return SimpleNamespace(past_key_values=past_key_values)


def test_the_cache_goes_in_and_comes_out_under_each_releases_name():
    from transformers import DynamicCache

    old = OldForward()
    assert cache_kwargs(old, "C") == {"past_key_values": "C"} and output_cache(old(**cache_kwargs(old, "C"))) == "C"
    model = tiny_model("llama")
    cache = DynamicCache(config=model.config)
    out = model(input_ids=torch.tensor([[1, 2, 3]]), **cache_kwargs(model, cache), use_cache=True)
    assert output_cache(out) is cache and cache.get_seq_length() == 3
    assert output_cache(SimpleNamespace()) is None
