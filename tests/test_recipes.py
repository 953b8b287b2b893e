"""The GPU recipes in recipes/ (every one but the SmolLM2 demos, which have their own tests).

Each recipe must load into CollectConfig / TrainConfig / EvalConfig through the same path as the
CLI (``lkvcli.config.load_config``), keep the paper's settings, and its train section must run one
real optimiser step on a tiny random model of the recipe model's architecture (CPU, float32, the
recipe's 32 lookahead tokens and LoRA on every linear layer).
"""

import json
import math
import re
from pathlib import Path

import pytest
import transformers
from safetensors.torch import load_file
from tiny_models import save_tiny_model, tiny_config, tiny_model, write_tiny_targets

from lkvcli.collect import CollectConfig
from lkvcli.config import load_config, read_recipe
from lkvcli.evaluate import EvalConfig
from lkvcli.train import TrainConfig, train

ROOT = Path(__file__).resolve().parents[1]
RECIPES = sorted(p for p in (ROOT / "recipes").glob("*.yaml") if "smollm2" not in p.name)

# The real models' architectures, written down by hand (no download): hub id -> tiny_models arch.
ARCH = {
    "meta-llama/Llama-3.1-8B-Instruct": "llama",
    "meta-llama/Llama-3.2-1B-Instruct": "llama",
    "meta-llama/Llama-3.2-3B-Instruct": "llama",
    "Qwen/Qwen3-1.7B": "qwen3",
    "Qwen/Qwen3-4B": "qwen3",
    "Qwen/Qwen3-8B": "qwen3",
    "mistralai/Mistral-7B-Instruct-v0.3": "mistral",
    "google/gemma-3-1b-it": "gemma3",  # text-only Gemma3ForCausalLM (gemma-3-4b-it is multimodal)
}
CONFIG_CLASS = {"llama": "LlamaConfig", "qwen3": "Qwen3Config", "mistral": "MistralConfig",
                "gemma3": "Gemma3TextConfig"}
LINEAR_KINDS = ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"]
BUDGETS = ["64", "128", "256", "512", "1024", "2048"]
BUILTIN_FALLBACK = '# data: "builtin:n=2000,min_tokens=2000,max_tokens=16000"'
PAPER_MIXTURE = "recipes/data/paper-mixture.yaml"
HF_SPEC = re.compile(r"^hf:[\w.-]+/[\w.-]+(:[\w.-]+)?(@[\w.-]+)?$")


def ids(paths):
    return [p.stem for p in paths]


def load_all(recipe: Path, targets_dir: Path):
    """(collect, train, eval) configs as the CLI builds them; train's data points at an existing folder."""
    collect = load_config(CollectConfig, recipe, "collect", {}, [])
    trained = load_config(TrainConfig, recipe, "train", {"data": [str(targets_dir)]}, [])
    evaluated = load_config(EvalConfig, recipe, "eval", {}, [])
    return collect, trained, evaluated


def test_every_model_has_a_recipe():
    models = {read_recipe(p).get("model") for p in RECIPES}
    assert models == set(ARCH), "add the new recipe's model to ARCH (its architecture) or fix the model id"


@pytest.mark.parametrize("recipe", RECIPES, ids=ids(RECIPES))
def test_recipe_loads_with_paper_settings(recipe, tmp_path):
    raw = read_recipe(recipe)
    assert set(raw) <= {"model", "device", "dtype", "collect", "train", "eval", "export"}
    collect, trained, evaluated = load_all(recipe, tmp_path)
    model = raw["model"]
    for config in (collect, trained, evaluated):
        assert (config.model, config.device, config.dtype) == (model, "auto", "bfloat16")

    assert collect.data == PAPER_MIXTURE, f"collect.data should be the paper's mixture, got {collect.data!r}"
    assert BUILTIN_FALLBACK in recipe.read_text()
    assert collect.max_new_tokens == 512
    assert collect.num_shards == 1  # sharding comes from the launcher or the command line, never the recipe

    la = trained.lookahead
    assert (la.num_tokens, la.lora_rank, la.lora_alpha) == (32, 8, 32)
    assert la.target_modules in ("all-linear", ["all-linear"])  # the str | list field parses a string as a list
    assert la.reduction == collect.reduction
    assert 1e-3 <= trained.lr <= 2e-3 and trained.schedule == "cosine" and trained.warmup_steps > 0
    assert trained.steps is None and 1 <= trained.epochs <= 2
    assert trained.batch_size * trained.grad_accum >= 16
    assert trained.eval_every > 0 and trained.checkpoint_every >= trained.eval_every

    assert evaluated.budgets == BUDGETS and evaluated.methods is None
    # the three sections chain: collect's output is what train and eval read, eval reads train's run
    raw_train = raw["train"]
    assert collect.out in raw_train["data"] and collect.out in evaluated.targets
    assert evaluated.adapter == trained.out


@pytest.fixture(scope="module")
def tiny_runs(tmp_path_factory):
    """Per architecture, a saved tiny model and a targets folder collected from it (built once)."""
    cache = {}

    def get(arch: str):
        if arch not in cache:
            root = tmp_path_factory.mktemp(arch)
            model_dir = save_tiny_model(arch, root / "model")
            targets = write_tiny_targets(root / "targets", tiny_model(arch), n=3, lengths=(8, 12), response_len=3)
            cache[arch] = (model_dir, targets)
        return cache[arch]

    return get


@pytest.mark.parametrize("recipe", RECIPES, ids=ids(RECIPES))
def test_recipe_trains_one_step_on_tiny_model_of_same_architecture(recipe, tiny_runs, tmp_path):
    arch = ARCH[read_recipe(recipe)["model"]]
    config_class = getattr(transformers, CONFIG_CLASS[arch])
    tiny = tiny_config(arch)
    assert type(tiny) is config_class
    if arch == "gemma3":
        assert "sliding_attention" in tiny.layer_types and "full_attention" in tiny.layer_types
    model_dir, targets = tiny_runs(arch)

    run = tmp_path / "run"
    cli = {"model": str(model_dir), "data": [str(targets)], "out": str(run), "steps": 1, "batch_size": 2,
           "device": "cpu"}
    config = load_config(TrainConfig, recipe, "train", cli, ["dtype=float32", "grad_accum=1", "val_split=1"])
    assert config.lookahead.num_tokens == 32  # kept from the recipe
    events = []
    summary = train(config, on_event=events.append)

    assert summary["steps"] == 1 and math.isfinite(summary["loss"]) and math.isfinite(summary["val_kl"])
    assert (run / "checkpoints" / "latest").read_text().strip() == "step-000001"
    assert (run / "checkpoints" / "step-000001" / "adapter" / "adapter_model.safetensors").is_file()
    start = next(e for e in events if e.kind == "start")
    assert start.data["trainable_parameters"] > 0
    assert json.loads((run / "run.json").read_text())["trainable_parameters"] == start.data["trainable_parameters"]

    meta = json.loads((run / "adapter" / "lookahead.json").read_text())["config"]
    assert sorted(meta["target_modules"]) == LINEAR_KINDS
    assert (meta["num_tokens"], meta["lora_rank"], meta["lora_alpha"]) == (32, 8, 32)
    tensors = load_file(str(run / "adapter" / "adapter_model.safetensors"))
    embeddings = load_file(str(run / "adapter" / "lookahead_embeddings.safetensors"))["embeddings"]
    assert tuple(embeddings.shape) == (32, tiny.hidden_size)
    for kind in LINEAR_KINDS:
        adapted = [k for k in tensors if f".{kind}." in k and "lora_A" in k]
        assert len(adapted) == tiny.num_hidden_layers, f"{kind}: LoRA on {len(adapted)} layers"


# One row per source as each dataset documents its schema (dataset card / dataset_info features); the
# datasets themselves cannot be downloaded here.
DOCUMENTED_ROWS = {
    "nvidia/ChatQA2-Long-SFT-data": {"question": "User: A long report on owls.\n\nQ: What is it about?\n\nAssistant:",
                                     "answer": "Owls.", "word count": 5},
    "allenai/tulu-3-sft-mixture": {"id": "oasst_1", "source": "oasst", "messages": [
        {"role": "user", "content": "Hi?"}, {"role": "assistant", "content": "Hello."}]},
    "bigcode/the-stack-smol": {"content": "def f():\n    return 1\n", "lang": "Python", "path": "a.py",
                               "repository_name": "x/y", "size": 22, "licenses": ["MIT"], "avg_line_length": 11.0,
                               "max_line_length": 12, "alphanum_fraction": 0.6},
    "openai/gsm8k": {"question": "What is 2 + 2?", "answer": "2 + 2 = 4.\n#### 4"},
    "allenai/ai2_arc": {"id": "Mercury_1", "question": "Which is a gas?", "answerKey": "B",
                        "choices": {"text": ["rock", "air", "wood", "iron"], "label": ["A", "B", "C", "D"]}},
    "Rowan/hellaswag": {"ind": 4, "activity_label": "Cooking", "ctx_a": "A man cuts.", "ctx_b": "he",
                        "ctx": "A man cuts. he", "endings": ["a", "b", "c", "d"], "source_id": "s", "split": "train",
                        "split_type": "indomain", "label": "3"},
}


def test_the_paper_mixture_maps_every_dataset_from_its_documented_schema(tmp_path):
    from lkvcli.prompts import load_prompts
    from lkvcli.prompts.mixture import read_mixture_file

    sources = read_mixture_file(str(ROOT / PAPER_MIXTURE))
    assert sum(source["count"] for source in sources) == 86_000
    for source in sources:
        assert HF_SPEC.match(source["data"]), source["data"]
        name = source["data"][3:].split("@")[0].split(":")[0]
        shots = source.get("shots", 0)
        rows = tmp_path / f"{name.replace('/', '_')}.jsonl"  # the examples, then the question
        rows.write_text((json.dumps(DOCUMENTED_ROWS[name]) + "\n") * (shots + 1))
        (record,) = load_prompts([{**source, "data": str(rows), "count": 1}])
        prompt = record.messages[-1]["content"]
        assert record.messages[-1]["role"] == "user" and prompt.strip(), name
        assert "{" not in prompt and "Assistant:" not in prompt and not prompt.startswith("User:"), (name, prompt)
        assert prompt.count("Answer") == (shots + 1 if shots else 0), name
