"""``LookaheadKV``: load a bundle onto a model, then score prompts and generate with an evicted cache.

    from lkvcli import LookaheadKV
    kv = LookaheadKV.from_pretrained("me/lookaheadkv-smollm2")      # or a bundle folder; loads the base model
    kv.generate("Summarise ...", budget=128, max_new_tokens=64)      # prefill, score, evict, decode

Scoring and eviction are lkv's own (:mod:`lkvcli.scorers` ``lookahead`` and :mod:`lkvcli.evict`),
the same code ``lkv eval`` measures.
"""

from __future__ import annotations

from pathlib import Path

import torch

from .adapters import attach
from .bundle import LKV_JSON, read_bundle
from .chat import chat_ids
from .errors import LkvError
from .files import read_json
from .evict import compress
from .generate import Sampling, decode_batch, stack_states, stop_token_ids
from .hub import check_repo_id, endpoint
from .models import fingerprint, load_model, resolve_model_path, same_model
from .scorers import get_scorer, prepare


def resolve_bundle(path_or_repo_id: str | Path, revision: str | None = None) -> Path:
    """A local bundle folder, or a Hub repo (or its cached copy): its ``lkv.json`` first, then only the
    files that ``lkv.json`` lists, the model card and the plots; a repo without ``lkv.json`` is refused
    before anything else is downloaded. :func:`lkvcli.bundle.read_bundle` then checks every file."""
    path = Path(path_or_repo_id).expanduser()
    if path.exists():
        return path
    from huggingface_hub import hf_hub_download, snapshot_download
    from huggingface_hub.errors import RemoteEntryNotFoundError

    repo_id = check_repo_id(str(path_or_repo_id))
    try:
        try:
            manifest = Path(hf_hub_download(repo_id, LKV_JSON, revision=revision, endpoint=endpoint()))
        except RemoteEntryNotFoundError:
            raise LkvError(f"{repo_id} is not an lkv bundle repository (it has no {LKV_JSON}); give a repo written "
                           "by `lkv export --push-to-hub`") from None
        listed = list(read_json(manifest, f"{repo_id} holds a damaged {LKV_JSON}").get("files", {}))
        return Path(snapshot_download(repo_id, revision=revision, endpoint=endpoint(),
                                      allow_patterns=[LKV_JSON, "README.md", "plots/*.png", *listed]))
    except LkvError:
        raise
    except Exception as exc:  # noqa: BLE001 - offline, not found, unauthorised: one line
        raise LkvError(f"{path_or_repo_id} is not a local folder, and downloading it from the Hub failed "
                       f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); give a bundle "
                       "folder written by `lkv export`, or check the repo id, HF_TOKEN and the network") from None


def _find_tokenizer(model, bundle_meta: dict):
    from transformers import AutoTokenizer

    for source in (getattr(model.config, "_name_or_path", None), bundle_meta["base_model"]["source"],
                   bundle_meta["base_model"]["id"]):
        if not source:
            continue
        try:
            return AutoTokenizer.from_pretrained(resolve_model_path(source)[0])
        except (OSError, ValueError, LkvError):
            continue
    return None


class LookaheadKV:
    """A lookahead module attached to a causal LM, with its tokenizer and scoring settings."""

    def __init__(self, adapter, tokenizer, meta: dict):
        self.adapter, self.tokenizer, self.meta = adapter, tokenizer, meta
        options = {k: v for k, v in meta["scoring"].items() if k not in ("method", "reduction")}
        self.scorer = get_scorer("lookahead", **options)
        self.reduction = meta["scoring"]["reduction"]
        self.default_budget = meta["budgets"]["default"]

    @classmethod
    def from_pretrained(cls, path_or_repo_id: str | Path, model=None, *, tokenizer=None,
                        allow_fingerprint_mismatch: bool = False, revision: str | None = None, device: str = "auto",
                        dtype: str = "auto") -> LookaheadKV:
        """Load a bundle (folder or Hub repo id) onto ``model`` (a transformers causal LM, modified in place:
        frozen, eval mode, lkv's attention, LoRA layers injected and off), or onto the base model named in
        the bundle when ``model`` is None. A model other than the one it was trained for is refused unless
        ``allow_fingerprint_mismatch`` (for models that share the weights, e.g. a re-saved copy). Loading the
        same bundle onto the same model again returns the first object; another bundle is refused."""
        bundle = read_bundle(resolve_bundle(path_or_repo_id, revision))
        base = bundle.meta["base_model"]
        key = str(Path(bundle.folder).resolve())
        attached = getattr(model, "_lkv_bundles", None) or {}
        if key in attached:  # loaded onto this model before: the same object
            return attached[key]
        if attached:
            raise LkvError(f"this model already carries the lkv bundle {next(iter(attached))}; load a fresh copy of "
                           f"the model for {path_or_repo_id}")
        if model is None:
            loaded = _load_base(base, device, dtype, load_model)
            model, tokenizer, current = loaded.model, tokenizer or loaded.tokenizer, loaded.fingerprint
        else:
            tokenizer = tokenizer or _find_tokenizer(model, bundle.meta)
            current = fingerprint(model, tokenizer)
            if tokenizer is None:  # the tokenizer cannot be checked; config and weights still are
                current["tokenizer"] = base["fingerprint"].get("tokenizer")
        if not same_model(current, base["fingerprint"]) and not allow_fingerprint_mismatch:
            raise LkvError(f"bundle {path_or_repo_id} was trained for {base['id'] or base['source']}, and this model "
                           "differs (config, tokenizer or weights fingerprint); load that model, or pass "
                           "allow_fingerprint_mismatch=True if this model shares its weights (e.g. a re-saved copy)")
        kv = cls(attach(model, bundle.adapter), tokenizer, bundle.meta)
        model._lkv_bundles = {key: kv}
        return kv

    @property
    def model(self):
        """The transformers model (its LoRA is off outside scoring: it is the plain base model)."""
        return self.adapter.base_model

    def encode(self, prompt, chat: bool = True) -> torch.Tensor:
        """(1, L) ids of a string (a user message, chat-formatted unless ``chat=False``), a list of chat
        messages, or token ids (used as they are)."""
        if isinstance(prompt, torch.Tensor):
            ids = prompt.reshape(1, -1)
        elif isinstance(prompt, (list, tuple)) and all(isinstance(t, int) for t in prompt):
            ids = torch.tensor([list(prompt)])
        else:

            if self.tokenizer is None:
                raise LkvError("no tokenizer for this model: pass tokenizer= to from_pretrained, or token ids")
            if chat or not isinstance(prompt, str):  # formatted exactly as lkv collect formats training prompts
                messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
                ids = torch.tensor([chat_ids(self.tokenizer, messages)[0]])
            else:
                ids = torch.tensor([self.tokenizer(prompt).input_ids])
        if ids.numel() == 0:
            raise LkvError("the prompt is empty")
        return ids.to(self.adapter.device)

    def _context(self, prompt, chat: bool):
        return prepare(self.scorer, self.model, self.encode(prompt, chat), tokenizer=self.tokenizer,
                       reduction=self.reduction, resources={"adapter": self.adapter})

    def scores(self, prompt, *, chat: bool = True) -> torch.Tensor:
        """Predicted importance of every prompt position: (layers, kv_heads, L) float32 (rows sum to 1)."""
        ctx = self._context(prompt, chat)
        return self.scorer.score(ctx)[0]

    def evict(self, prompt, budget: int | float | str | None = None, *, chat: bool = True):
        """Prefill, score and evict: ``(Prefill, Eviction)`` (:mod:`lkvcli.generate`, :mod:`lkvcli.evict`), the
        cache holding ``budget`` entries per layer and KV head (an int, or a ratio of the prompt in (0, 1];
        default: the bundle's recommended one); decode from it with :func:`lkvcli.generate.greedy_decode`."""
        ctx = self._context(prompt, chat)
        return compress(self.scorer, self.scorer.score(ctx), ctx.state, budget or self.default_budget)

    def generate(self, prompt, budget: int | float | str | None = None, max_new_tokens: int = 256, *,
                 chat: bool = True, do_sample: bool = False, temperature: float = 1.0, top_k: int = 0,
                 top_p: float = 1.0, seed: int | None = None, stop: str | list[str] | None = None) -> str | list[str]:
        """The answer to ``prompt`` with its cache evicted to ``budget`` (see :meth:`evict`).

        Greedy by default; ``do_sample`` draws with ``temperature``, ``top_k``, ``top_p`` (``seed``: a
        repeatable draw). ``stop``: strings that end the answer (kept in it, as transformers does).
        A list of prompts (strings, or chat-message lists) is evicted prompt by prompt and decoded as
        one batch, each continuing at its own position; it returns a list of answers.
        """
        sampling = Sampling(do_sample, temperature, top_k, top_p, seed)
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise LkvError(f"max_new_tokens={max_new_tokens!r}: must be a positive integer")
        batch = isinstance(prompt, (list, tuple)) and bool(prompt) and all(
            isinstance(p, (str, list, tuple, torch.Tensor)) for p in prompt)
        prompts = list(prompt) if batch else [prompt]
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        if stops and self.tokenizer is None:
            raise LkvError("stop strings need a tokenizer: pass tokenizer= to from_pretrained")
        states = [self.evict(p, budget, chat=chat)[0] for p in prompts]
        state = stack_states(states) if len(states) > 1 else states[0]
        ended = (lambda tokens: any(s in self.tokenizer.decode(tokens[-64:]) for s in stops)) if stops else None
        rows = decode_batch(self.model, state, max_new_tokens, stop_token_ids(self.model, self.tokenizer),
                            sampling=sampling, stop=ended)
        answers = [self._text(row.tokens, stops) for row in rows]
        return answers if batch else answers[0]

    def _text(self, tokens: list[int], stops: list[str]) -> str:
        if self.tokenizer is None:
            return str(tokens)
        text = self.tokenizer.decode(tokens, skip_special_tokens=True)
        ends = [text.index(s) + len(s) for s in stops if s in text]
        return text[: min(ends)] if ends else text

    def __repr__(self) -> str:
        base = self.meta["base_model"]
        return (f"LookaheadKV(base={base['id'] or base['source']!r}, tokens={self.meta['num_tokens']}, "
                f"default_budget={self.default_budget})")


def _load_base(base: dict, device: str, dtype: str, load_model):
    """The bundle's base model: its training source when available here, else its Hub id."""
    first, second = base["source"], base["id"]
    try:
        return load_model(first, device=device, dtype=dtype)
    except LkvError:
        if not second or second == first:
            raise
    return load_model(second, device=device, dtype=dtype)
