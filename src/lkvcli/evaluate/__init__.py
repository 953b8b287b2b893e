"""``lkv eval``: how well each method predicts the response's attention, answers with an evicted
cache, and what it costs. Library code: never prints; ``on_event`` feeds progress displays.

Three parts (``parts``):

* ``prediction``: on held-out collected records, per method, KL(GT || method) (methods that
  produce a distribution) and, per budget, GT-mass recall, recall excluding the first 4
  positions (attention sinks hold much of the mass), and overlap of the kept set with the
  oracle's top-C set. Every method keeps what the eviction runtime would keep.
* ``answers``: greedy answers with the cache evicted to each budget, scored by the record's
  ``metric`` against its ``answer``, and by agreement (ROUGE-L F1 over words) with the
  full-cache answer, which is the collected response itself (same model, greedy).
* ``overhead``: per method, prefill, scoring, eviction and time to first token against plain
  prefill, interleaved and repeated; medians.

Modes: ``whole`` (the paper's: the whole prompt is prefilled, scored and evicted) and
``context`` (kvpress's: only the context is; then the question and the chat template's tail
are fed over the evicted cache at their original positions; see docs/eval.md).

The package, in the order the data flows: :mod:`.config` (settings), :mod:`.records` (which
records, where the context ends), :mod:`.engine` (one record: shared prefill, scoring, batched
decoding), :mod:`.metrics` (text and prediction metrics), :mod:`.journal` (predictions.jsonl,
resumable), :mod:`.aggregate` (means, throughput), :mod:`.overhead` (timings), :mod:`.run`
(setup and the whole run).
"""

from ..environment import environment
from .config import DEFAULT_BUDGETS, PARTS, EvalConfig, config_dict
from .engine import evaluate_record, evaluate_record_sequential, score_prompt
from .metrics import SINKS_EXCLUDED, answer_score, prediction_metrics, rouge_l
from .overhead import PeakMemory, overhead_table, time_method
from .records import context_split, select_records
from .run import EvalRun, check_writable, evaluate, setup

__all__ = ["DEFAULT_BUDGETS", "PARTS", "SINKS_EXCLUDED", "EvalConfig", "EvalRun", "PeakMemory", "answer_score",
           "check_writable", "config_dict", "context_split", "environment", "evaluate", "evaluate_record",
           "evaluate_record_sequential", "overhead_table", "prediction_metrics", "rouge_l", "score_prompt",
           "select_records", "setup", "time_method"]
