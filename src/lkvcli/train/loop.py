"""``lkv train``: fit the lookahead module to collected targets (library code: no printing).

The run is a :class:`Trainer` read top to bottom: :meth:`~Trainer.set_up` (the run folder,
the data, the adapter, the optimiser), :meth:`~Trainer.resume` (from the latest checkpoint),
then :meth:`~Trainer.step` until done, with :meth:`~Trainer.validate` and
:meth:`~Trainer.checkpoint` at their intervals, and :meth:`~Trainer.finish` (the final adapter).
Data parallel through ``accelerate``: every process takes its share of the global batch and the
gradients are summed across processes, so the result does not depend on the number of processes.
The run folder is :mod:`lkvcli.runs`.
"""

from __future__ import annotations

import importlib.util
import math
import signal
from contextlib import ExitStack
import time
from pathlib import Path
from typing import Callable

import torch

from .. import runs
from ..config import to_dict
from ..context_mode import TrainingRecords
from ..environment import environment
from ..errors import LkvError
from ..files import remove_leftovers
from ..locks import folder_lock
from ..lookahead import LookaheadAdapter
from ..models import LoadedModel, load_model, resolve_device
from ..preempt import StopRequest, Stopped
from ..progress import Event, Listener, ignore
from ..targets import TargetsReader
from .config import RESUMABLE, TrainConfig
from .data import PrefillCache, batch_loss, check_targets, data_order, usable_split, validation_kl

STATES = ("optimizer", "scheduler", "rng")


def lr_lambda(config: TrainConfig, total_steps: int) -> Callable[[int], float]:
    """Multiplier of ``lr`` at a step: linear warmup, then constant / cosine / linear decay to min_lr_ratio."""
    warm, floor = config.warmup_steps, config.min_lr_ratio

    def factor(step: int) -> float:
        if step < warm:
            return (step + 1) / warm
        if config.schedule == "constant":
            return 1.0
        progress = min(1.0, (step - warm) / max(1, total_steps - warm))
        decay = 0.5 * (1 + math.cos(math.pi * progress)) if config.schedule == "cosine" else 1 - progress
        return floor + (1 - floor) * decay

    return factor


def check_run_folder(config: TrainConfig, run: Path) -> Path | None:
    """Check the run folder against ``resume``; returns the checkpoint to resume from."""
    latest = runs.latest_checkpoint(run)
    if not config.resume:
        if latest is not None:  # a folder with settings but no checkpoint yet holds nothing to keep
            raise LkvError(f"{run} already holds a training run; pass --resume to continue it or choose another --out")
        return None
    if latest is None:
        raise LkvError(f"--resume: no checkpoint in {run / runs.CHECKPOINTS}; run without --resume to start")
    saved, now = runs.checkpoint_config(latest), to_dict(config)
    changed = sorted(k for k in set(saved) | set(now) if k not in RESUMABLE and saved.get(k) != now.get(k))
    if changed:
        raise LkvError(f"--resume: {changed[0]} differs from the checkpoint's ({saved.get(changed[0])!r} vs "
                       f"{now.get(changed[0])!r}); resume with the same settings or use another --out")
    return latest


def _rng_state() -> dict:
    state = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class Trainer:
    """One training run; see the module docstring for the order of its steps."""

    def __init__(self, config: TrainConfig, on_event: Listener | None = None, loaded: LoadedModel | None = None):
        self.config, self.loaded, self.run = config, loaded, Path(config.out)
        self._listener = on_event or ignore
        self.start = self.step_no = 0
        self._applying = False
        self.val_kl = self.first_val = self.loss = None

    def emit(self, event: Event) -> None:
        if self.main:
            self._listener(event)

    # ------------------------------------------------------------ set up
    def set_up(self) -> Path | None:
        """Accelerator, run folder check, targets, model, split, adapter, optimiser; returns the
        checkpoint to resume from."""
        from accelerate import Accelerator

        config = self.config
        config.check_data()
        if config.log_with and importlib.util.find_spec(config.log_with) is None:
            raise LkvError(f"log_with: tracker {config.log_with!r} is not installed; `pip install {config.log_with}` "
                           "or drop log_with")
        on_cpu = config.device == "cpu" or (config.device == "auto" and resolve_device("auto").type == "cpu")
        self.accelerator = acc = Accelerator(cpu=on_cpu, log_with=config.log_with or None, project_dir=config.out)
        self.rank, self.world, self.main = acc.process_index, acc.num_processes, acc.is_main_process
        if self.main:  # one writer per run folder (the main process writes it)
            self._stack.enter_context(folder_lock(self.run, "lkv train"))
            remove_leftovers(self.run)
        resume_from = check_run_folder(config, self.run)
        acc.wait_for_everyone()  # every process has checked the run folder before the main one writes to it
        self.reader = reader = TargetsReader(config.data)
        if self.loaded is None:
            device = acc.device if config.device == "auto" or self.world > 1 else resolve_device(config.device)
            self.loaded = load_model(config.model, device=str(device), dtype=config.dtype)
        check_targets(reader, self.loaded, config)
        train_records, self.val_records = usable_split(reader, config)
        self.records = TrainingRecords(reader, config.mode, self.loaded.tokenizer)
        self.train_idx, self.val_idx = self.records.items(train_records), self.records.items(self.val_records)
        self.per_step = config.batch_size * config.grad_accum * self.world
        self.total = config.steps or max(1, math.ceil(config.epochs * len(self.train_idx) / self.per_step))
        self.adapter = LookaheadAdapter.attach(self.loaded.model, config.lookahead, seed=config.seed)
        self.params = [p for _, p in self.adapter.named_parameters()]
        self.optimizer = torch.optim.AdamW(self.params, lr=config.lr, betas=tuple(config.betas),
                                           weight_decay=config.weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_lambda(config, self.total))
        self.prefills = PrefillCache(config.prefill_cache_mb)
        return resume_from

    def resume(self, checkpoint: Path) -> None:
        """Adapter, optimiser, schedule and RNG exactly as the checkpoint left them."""
        state, states = runs.load_checkpoint(checkpoint, self.adapter, list(STATES))
        self.optimizer.load_state_dict(states["optimizer"])
        self.scheduler.load_state_dict(states["scheduler"])
        _set_rng_state(states["rng"])
        self.start = self.step_no = state["step"]

    def write_run_files(self) -> None:
        """``config.json``, ``run.json`` and the metrics cut back to the resumed step (main process)."""
        if not self.main:
            return
        config, reader, loaded = self.config, self.reader, self.loaded
        self.run.mkdir(parents=True, exist_ok=True)
        runs.write_config(self.run, to_dict(config))
        runs.write_run_info(self.run, runs.RunInfo(
            model={"source": loaded.source, "fingerprint": loaded.fingerprint},
            targets={"folders": [str(f) for f in reader.folders], "records": len(reader),
                     "model_source": reader.manifest["model"]["source"],
                     "settings": reader.manifest.get("settings", {})},
            processes=self.world, global_batch=self.per_step, total_steps=self.total,
            train_records=len(self.train_idx), val_ids=[reader.ids()[i] for i in self.val_records],
            excluded_tasks=sorted(config.exclude_tasks), mode=config.mode,
            trainable_parameters=self.adapter.num_parameters(), environment=environment()))
        runs.trim_metrics(self.run, self.start)

    # ------------------------------------------------------------ the parts of a run
    def log(self, record: dict) -> None:
        if self.main:
            runs.append_metrics(self.run, record)
        if self.config.log_with:
            self.accelerator.log({k: v for k, v in record.items() if k != "step" and v is not None},
                                 step=record["step"])

    def validate(self) -> float | None:
        """Validation KL (all processes), logged and reported."""
        self.adapter.train(False)
        self.val_kl = validation_kl(self.adapter, self.records, self.val_idx, self.config.batch_size,
                                    self.accelerator, self.prefills)
        return self.val_kl

    def step(self, stop_requested: bool) -> bool:
        """One optimiser step over this process's share of the next global batch; True when a stop
        was asked for on any process."""
        config, rank, per_step = self.config, self.rank, self.per_step
        shares = config.batch_size * config.grad_accum
        self.adapter.train(True)
        torch.manual_seed(config.seed * 1_000_003 + self.step_no * 101 + rank)  # dropout: resumable, per process
        mine = data_order(self.train_idx, config.seed, self.step_no * per_step, per_step)[rank * shares:
                                                                                           (rank + 1) * shares]
        mine.sort(key=lambda i: self.records.meta(i)["prompt_len"])  # similar lengths share a micro-batch
        loss_sum = torch.zeros((), device=self.adapter.device)
        for a in range(config.grad_accum):
            part = batch_loss(self.adapter, [self.records[i] for i in mine[a * config.batch_size:
                                                                            (a + 1) * config.batch_size]],
                              self.prefills, config.objective)
            part = part.sum() / per_step
            part.backward()
            loss_sum += part.detach()
        # one collective: every gradient (the last layer's v/o/MLP LoRA gets none), the loss, the stop flag
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in self.params]
                         + [loss_sum.reshape(1), torch.tensor([float(stop_requested)], device=loss_sum.device)])
        if self.world > 1:
            flat = self.accelerator.reduce(flat, "sum")
        offset = 0
        for p in self.params:
            p.grad = flat[offset:offset + p.numel()].view_as(p).clone()
            offset += p.numel()
        if config.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(self.params, config.max_grad_norm)
        self._applying = True  # from here to the step count, an interrupt leaves no consistent state
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step_no += 1
        self._applying = False
        self.loss = float(flat[-2])
        return float(flat[-1]) > 0

    def checkpoint(self) -> None:
        """Checkpoint the current step (main process; once per step), all processes in step."""
        step = self.step_no
        if self.main and not (self.run / runs.CHECKPOINTS / f"step-{step:06d}").is_dir():
            path = runs.save_checkpoint(
                self.run, step, adapter=self.adapter,
                states={"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                        "rng": _rng_state()},
                position=step * self.per_step, seed=self.config.seed, config=to_dict(self.config),
                keep=self.config.keep_checkpoints)
            self.emit(Event("note", "train", step, self.total, f"checkpoint {path}",
                            data={"checkpoint": step, "path": str(path)}))
        self.accelerator.wait_for_everyone()

    def finish(self) -> Path | None:
        """The final adapter, ``adapter/`` of the run folder (main process)."""
        if not self.main:
            return None
        return runs.save_final_adapter(self.run, self.adapter, {
            "model": {"source": self.loaded.source, "fingerprint": self.loaded.fingerprint}, "step": self.step_no})

    # ------------------------------------------------------------ the run
    def fit(self) -> dict:
        with ExitStack() as self._stack:
            return self._fit()

    def _fit(self) -> dict:
        config = self.config
        resume_from = self.set_up()
        if resume_from is not None:
            self.resume(resume_from)
        self.write_run_files()
        if config.log_with:
            self.accelerator.init_trackers("lkv-train", config=_flat(to_dict(config)))
        self.emit(Event("start", "train", self.start, self.total,
                        f"{len(self.train_idx)} records ({len(self.val_idx)} held out), {self.total} steps of "
                        f"{self.per_step} examples on {self.world} process(es), "
                        f"{self.adapter.num_parameters():,} trainable parameters -> {self.run}",
                        data={"train_records": len(self.train_idx), "val_records": len(self.val_idx),
                              "global_batch": self.per_step, "processes": self.world, "run": str(self.run),
                              "trainable_parameters": self.adapter.num_parameters()}))
        t0 = time.perf_counter()
        self.first_val = self.validate()
        if self.start == 0:
            self.log({"step": 0, "val_kl": self.val_kl})
        self._report_val()
        self._loop()
        self.checkpoint()
        self.validate()
        self.log({"step": self.step_no, "val_kl": self.val_kl})
        self.finish()
        summary = {"run": str(self.run), "adapter": str(self.run / runs.FINAL_ADAPTER), "steps": self.step_no,
                   "loss": self.loss, "start_step": self.start, "val_kl_start": self.first_val,
                   "val_kl": self.val_kl, "wall_s": time.perf_counter() - t0, "processes": self.world,
                   "main": self.main, "prefill_cache": self.prefills.stats()}
        self.emit(Event("done", "train", self.step_no, self.total, data=summary))
        if config.log_with:
            self.accelerator.end_training()
        self.accelerator.wait_for_everyone()
        return summary

    def _report_val(self) -> None:
        self.emit(Event("note", "train", self.step_no, self.total, f"step {self.step_no}: val KL "
                        + ("-" if self.val_kl is None else f"{self.val_kl:.4f}"), data={"val_kl": self.val_kl}))

    def _loop(self) -> None:
        """Steps until ``total``; the first Ctrl-C checkpoints at the next step boundary and re-raises."""
        config, t0 = self.config, time.perf_counter()
        train_s = 0.0
        try:
            with StopRequest(sigint=True) as stop:
                while self.step_no < self.total:
                    tic = time.perf_counter()
                    # the flag travels with the step's collective, so every process stops after the same step;
                    # a single process also stops right after the step during which it was asked
                    stop_now = self.step(stop.requested) or (self.world == 1 and stop.requested)
                    step = self.step_no
                    train_s += time.perf_counter() - tic
                    rate = (step - self.start) / train_s
                    if config.eval_every and step % config.eval_every == 0 and step < self.total:
                        self.validate()
                        self.log({"step": step, "val_kl": self.val_kl})
                        self._report_val()
                    lr = self.scheduler.get_last_lr()[0]
                    if step % config.log_every == 0 or step == self.total:
                        self.log({"step": step, "loss": self.loss, "lr": lr, "steps_per_s": rate,
                                  "time_s": time.perf_counter() - t0})
                    if config.checkpoint_every and step % config.checkpoint_every == 0 and step < self.total:
                        self.checkpoint()
                    if stop_now:  # asked on some process: every process stops after this same step
                        raise Stopped(stop.signum or signal.SIGTERM)
                    val = "-" if self.val_kl is None else f"{self.val_kl:.4f}"
                    self.emit(Event("advance", "train", step, self.total,
                                    f"loss {self.loss:.4f} val {val} {rate:.2f} steps/s, lr {lr:.2e}, "
                                    f"eta {(self.total - step) / rate:.0f} s",
                                    log=step % config.log_every == 0 or step == self.total,
                                    data={"loss": self.loss, "val_kl": self.val_kl, "lr": lr, "steps_per_s": rate}))
        except KeyboardInterrupt:
            # a step cut short before its optimiser update leaves the weights of the step before: consistent
            if self.step_no > self.start and not self._applying:
                self.optimizer.zero_grad(set_to_none=True)
                self.checkpoint()
            raise
        finally:
            self.adapter.train(False)


def train(config: TrainConfig, on_event: Callable[[Event], None] | None = None,
          loaded: LoadedModel | None = None) -> dict:
    """Train a lookahead adapter; returns the summary. ``on_event`` gets :class:`~lkvcli.progress.Event`s
    on the main process. ``loaded`` skips loading ``config.model`` (tests)."""
    return Trainer(config, on_event, loaded).fit()


def _flat(data: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in data.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value if isinstance(value, (int, float, str, bool)) else str(value)
    return out
