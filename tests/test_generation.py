"""``LookaheadKV.generate`` with the arguments transformers users expect: greedy equal to plain
``model.generate`` when nothing is evicted, a batch equal to its prompts one by one, seeded sampling
that repeats, top-k / top-p cuts, stop strings, and one-line errors for bad settings."""

import pytest
import torch
from helpers import PROMPT

from lkvcli.errors import LkvError
from lkvcli.generate import Sampling

PROMPTS = [PROMPT, "Say item 4. " * 5, "Items 1, 2 and 3. " * 7]


def test_greedy_with_room_for_the_whole_prompt_is_plain_model_generate(kv):
    for prompt in PROMPTS:
        ids = kv.encode(prompt)
        L = ids.shape[1]
        plain = kv.model.generate(ids, max_new_tokens=10, do_sample=False, attention_mask=torch.ones_like(ids),
                                  pad_token_id=0)[0, L:].tolist()  # ends with the stop token, if any
        assert kv.generate(ids, budget=L, max_new_tokens=10) == kv.tokenizer.decode(plain, skip_special_tokens=True)
        assert kv.generate(prompt, budget=L + 5, max_new_tokens=10) == kv.generate(ids, budget=L, max_new_tokens=10)


def test_a_batch_equals_its_prompts_one_by_one(kv):
    lengths = {kv.encode(p).shape[1] for p in PROMPTS}
    assert len(lengths) == 3  # different lengths: every row continues at its own position
    for budget in (8, 1000):  # evicted, and kept whole (rows padded to the longest)
        assert kv.generate(PROMPTS, budget=budget, max_new_tokens=8) == [
            kv.generate(p, budget=budget, max_new_tokens=8) for p in PROMPTS]
    sampled = dict(budget=8, max_new_tokens=8, do_sample=True, temperature=1.3, seed=7)
    assert kv.generate(PROMPTS, **sampled) == [kv.generate(p, **sampled) for p in PROMPTS]


def test_seeded_sampling_repeats_and_the_seed_matters(kv):
    args = dict(budget=8, max_new_tokens=12, do_sample=True, temperature=2.0)
    first = kv.generate(PROMPT, seed=3, **args)
    assert kv.generate(PROMPT, seed=3, **args) == first
    assert len({kv.generate(PROMPT, seed=s, **args) for s in range(6)}) > 1


def test_top_k_1_and_a_tiny_top_p_are_greedy(kv):
    greedy = kv.generate(PROMPT, budget=8, max_new_tokens=8)
    assert kv.generate(PROMPT, budget=8, max_new_tokens=8, do_sample=True, top_k=1, seed=1) == greedy
    assert kv.generate(PROMPT, budget=8, max_new_tokens=8, do_sample=True, top_p=1e-6, seed=1) == greedy


def test_top_k_and_top_p_keep_only_their_tokens():
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0]])
    top2 = [Sampling(True, top_k=2, seed=s) for s in range(40)]
    seen_k = {sampling.pick(logits, sampling.generators(1, "cpu"))[0] for sampling in top2}
    assert seen_k == {0, 1}
    probs = logits.softmax(-1)[0]  # .64 .24 .09 ...: the smallest set holding 0.8 is the first two
    assert probs[0] < 0.8 < probs[:2].sum()
    seen_p = {Sampling(True, top_p=0.8).pick(logits, [torch.Generator().manual_seed(s)])[0] for s in range(40)}
    assert seen_p == {0, 1}


def test_stop_strings_end_the_answer(kv):
    text = kv.generate(PROMPT, budget=16, max_new_tokens=16)
    assert len(text) > 4, text
    stop = text[2:4]
    assert kv.generate(PROMPT, budget=16, max_new_tokens=16, stop=stop) == text[: text.index(stop) + len(stop)]
    assert kv.generate(PROMPT, budget=16, max_new_tokens=16, stop=["\u2603 never"]) == text


@pytest.mark.parametrize("bad, message", [
    ({"do_sample": True, "temperature": 0}, "temperature=0: must be > 0"),
    ({"top_p": 0.0}, "top_p=0.0: must be in (0, 1]"),
    ({"top_k": -1}, "top_k=-1: must be a non-negative integer"),
    ({"max_new_tokens": 0}, "max_new_tokens=0: must be a positive integer"),
])
def test_bad_settings_fail_with_one_line(kv, bad, message):
    with pytest.raises(LkvError) as err:
        kv.generate(PROMPT, budget=8, **bad)
    assert message in str(err.value) and "\n" not in str(err.value)
