"""Experiment tracking: `Tracking` sends each step's metrics to the `LOGGER_BACKENDS` that `trainer.logger`
names (wandb, mlflow and tensorboard are optional extras, imported when selected); `StepProgress` is the tqdm bar."""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, TextIO

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from hybridrl.utils.registry import Registry

_logger = logging.getLogger(__name__)

__all__ = ["LOGGER_BACKENDS", "StepProgress", "Tracking", "format_metrics_table", "parse_logger_backends"]


class LoggerBackend(Protocol):
    def log(self, data: Mapping[str, float], step: int) -> None: ...

    def finish(self) -> None: ...


# Each entry: a class built as cls(project_name, experiment_name, config, log_dir).
LOGGER_BACKENDS: Registry[type] = Registry("logger backend")


def _missing_extra(package: str, backend: str) -> ImportError:
    return ImportError(
        f"trainer.logger includes {backend!r}, which needs the {package!r} package; install it with "
        f'pip install "hybridrl[{backend}]", or remove {backend!r} from trainer.logger'
    )


def _as_scalar(key: str, value: Any) -> float | int:
    """A Python number from a number, a numpy scalar or a one-element tensor; TypeError otherwise."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise TypeError(f"metric {key!r} is a tensor of shape {tuple(value.shape)}; log scalars only")
        value = value.item()
    if isinstance(value, (np.ndarray, np.generic)) and value.size == 1:
        value = value.item()
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, (int, float)):
        return value
    raise TypeError(f"metric {key!r} has type {type(value).__name__}; log numbers only (float, int, bool)")


def _plain_config(config: Any) -> dict[str, Any] | None:
    """A plain (resolved) dict from a dict or an OmegaConf config, for backends that store the config."""
    if isinstance(config, DictConfig):
        return OmegaConf.to_container(config, resolve=True)  # type: ignore[return-value]
    return None if config is None else dict(config)


def format_metrics_table(data: Mapping[str, float], step: int, width: int = 110) -> str:
    """The console view of one step: one block per metric group (a key's first path segment; `misc` for keys
    without a slash), in aligned columns."""
    groups: dict[str, list[tuple[str, str]]] = {}
    for key in sorted(data):
        group, _, name = key.partition("/")
        if not name:
            group, name = "misc", key
        value = data[key]  # ints as they are, floats with 4 significant digits
        shown = str(value) if isinstance(value, int) or not math.isfinite(value) else f"{value:.4g}"
        groups.setdefault(group, []).append((name, shown))
    group_width = max((len(g) for g in groups), default=0)
    lines = [f"---- step {step} ".ljust(width, "-")]
    for group, entries in groups.items():
        name_width = max(len(name) for name, _ in entries)
        value_width = max(len(value) for _, value in entries)
        cell_width = name_width + 1 + value_width + 3  # "name value" plus a 3-space gutter
        per_line = max(1, (width - group_width - 3) // cell_width)
        for start in range(0, len(entries), per_line):
            cells = [f"{name:<{name_width}} {value:>{value_width}}"
                     for name, value in entries[start : start + per_line]]
            label = group if start == 0 else ""
            lines.append(f"{label:<{group_width}} | " + "   ".join(cells))
    return "\n".join(lines)


@LOGGER_BACKENDS.register("console")
class ConsoleLogger:
    """Prints `format_metrics_table` to stdout each step."""

    def __init__(self, project_name: str, experiment_name: str, config: Any, log_dir: str | None) -> None:
        pass

    def log(self, data: Mapping[str, float], step: int) -> None:
        tqdm.write(format_metrics_table(data, step))  # to stdout, keeping an active progress bar below the table

    def finish(self) -> None:
        pass


ROLLED_BACK_SUFFIX = ".rolled_back"  # metrics.jsonl.rolled_back: lines a resumed run moved aside


def _step_of_line(line: str) -> int | None:
    try:
        step = json.loads(line).get("step")
    except (json.JSONDecodeError, AttributeError):  # a line cut short by a kill, or not an object
        return None
    return step if isinstance(step, int) else None


def _write_lines_durably(path: Path, lines: Sequence[str]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        f.writelines(lines)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


@LOGGER_BACKENDS.register("file")
class FileLogger:
    """Appends `{"step": step, **metrics}` as one fsynced JSON line per step to `<log_dir>/metrics.jsonl`
    (NaN and infinities as null); logging the newest step again adds its new keys, keeping written values."""

    def __init__(self, project_name: str, experiment_name: str, config: Any, log_dir: str | None) -> None:
        if log_dir is None:
            raise ValueError("the 'file' logger needs a directory: set trainer.default_local_dir "
                             "(Tracking(log_dir=...))")
        Path(log_dir).mkdir(parents=True, exist_ok=True)
        self.path = Path(log_dir) / "metrics.jsonl"
        self._last: dict[str, Any] | None = self._read_last_record()
        self._file = self.path.open("a", encoding="utf-8")

    def _read_last_record(self) -> dict[str, Any] | None:
        lines = self.path.read_text(encoding="utf-8").splitlines() if self.path.is_file() else []
        return json.loads(lines[-1]) if lines and _step_of_line(lines[-1]) is not None else None

    def log(self, data: Mapping[str, float], step: int) -> None:
        if "step" in data:
            raise ValueError("the 'file' logger writes its own 'step' key; rename the metric called 'step'")
        record = {"step": step, **{k: None if isinstance(v, float) and not math.isfinite(v) else v
                                   for k, v in data.items()}}
        if self._last is not None and self._last["step"] == step:  # rewrite the last line with the new keys
            record = {**record, **self._last}
            self._file.close()
            lines = self.path.read_text(encoding="utf-8").splitlines(keepends=True)
            _write_lines_durably(self.path, [*lines[:-1], json.dumps(record, allow_nan=False) + "\n"])
            self._file = self.path.open("a", encoding="utf-8")
        else:
            self._file.write(json.dumps(record, allow_nan=False) + "\n")
            self._file.flush()
            os.fsync(self._file.fileno())
        self._last = record

    def rewind(self, keep_through: int) -> int:
        """Keep the lines up to step `keep_through` and append the rest (and unparsable lines) to
        `<file>.rolled_back`, which a resumed run would otherwise log twice; returns how many moved."""
        self._file.close()
        lines = self.path.read_text(encoding="utf-8").splitlines(keepends=True) if self.path.is_file() else []
        keep, moved = [], []
        for line in lines:
            step = _step_of_line(line)
            (keep if step is not None and step <= keep_through else moved).append(line)
        if moved:
            with self.path.with_name(self.path.name + ROLLED_BACK_SUFFIX).open("a", encoding="utf-8") as f:
                f.writelines(line if line.endswith("\n") else line + "\n" for line in moved)
                f.flush()
                os.fsync(f.fileno())
            _write_lines_durably(self.path, keep)
        self._last = self._read_last_record()
        self._file = self.path.open("a", encoding="utf-8")
        return len(moved)

    def finish(self) -> None:
        if not self._file.closed:
            self._file.close()


@LOGGER_BACKENDS.register("tensorboard")
class TensorboardLogger:
    """Scalars to a SummaryWriter in `$TENSORBOARD_DIR` (verl's variable), else `<log_dir>/tensorboard`, else
    verl's `tensorboard_log/<project>/<experiment>`."""

    def __init__(self, project_name: str, experiment_name: str, config: Any, log_dir: str | None) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as err:  # torch's writer needs the tensorboard package
            raise _missing_extra("tensorboard", "tensorboard") from err
        if os.environ.get("TENSORBOARD_DIR"):
            directory = Path(os.environ["TENSORBOARD_DIR"])
        elif log_dir is not None:
            directory = Path(log_dir) / "tensorboard"
        else:
            directory = Path("tensorboard_log") / project_name / experiment_name
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        self._writer = SummaryWriter(log_dir=str(directory))

    def log(self, data: Mapping[str, float], step: int) -> None:
        for key, value in data.items():
            self._writer.add_scalar(key, value, global_step=step)
        self._writer.flush()

    def rewind(self, keep_through: int) -> None:
        """Hide the events of steps after `keep_through` (-1: all) that earlier runs wrote here: a new event file
        starts with TensorBoard's purge marker; the old files are left as they are."""
        self._writer.close()
        self._writer = type(self._writer)(log_dir=str(self.directory), purge_step=keep_through + 1)

    def finish(self) -> None:
        self._writer.close()


@LOGGER_BACKENDS.register("wandb")
class WandbLogger:
    """A wandb run named after the experiment, with its files under `log_dir`."""

    def __init__(self, project_name: str, experiment_name: str, config: Any, log_dir: str | None) -> None:
        try:
            import wandb
        except ImportError as err:
            raise _missing_extra("wandb", "wandb") from err
        if log_dir is not None:
            Path(log_dir).mkdir(parents=True, exist_ok=True)
        self._run = wandb.init(project=project_name, name=experiment_name, config=_plain_config(config),
                               dir=log_dir)

    def log(self, data: Mapping[str, float], step: int) -> None:
        self._run.log(dict(data), step=step)

    def finish(self) -> None:
        self._run.finish()


def _flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """`{"a": {"b": 1}}` -> `{"a.b": "1"}`: MLflow params are flat strings."""
    flat = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(_flatten(value, f"{name}."))
        else:
            flat[name] = str(value)[:500]  # MLflow's documented limit on a param value is 500 chars
    return flat


@LOGGER_BACKENDS.register("mlflow")
class MlflowLogger:
    """An MLflow run (experiment = project, run name = experiment) in `$MLFLOW_TRACKING_URI`, else SQLite at
    `<log_dir>/mlflow/mlflow.db`; `@` in metric names becomes `_at_`, as in verl."""

    def __init__(self, project_name: str, experiment_name: str, config: Any, log_dir: str | None) -> None:
        try:
            from mlflow.entities import Metric, Param
            from mlflow.tracking import MlflowClient
        except ImportError as err:
            raise _missing_extra("mlflow", "mlflow") from err
        self._metric_cls = Metric
        store = (Path(log_dir if log_dir is not None else ".") / "mlflow").resolve()
        uri = os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:
            # MLflow 3 refuses a ./mlruns file store unless MLFLOW_ALLOW_FILE_STORE=true; SQLite it recommends
            store.mkdir(parents=True, exist_ok=True)
            uri = f"sqlite:///{store / 'mlflow.db'}"
        self._client = MlflowClient(tracking_uri=uri)
        experiment = self._client.get_experiment_by_name(project_name)
        experiment_id = experiment.experiment_id if experiment else \
            self._client.create_experiment(project_name, artifact_location=(store / "artifacts").as_uri())
        self.run_id = self._client.create_run(experiment_id, run_name=experiment_name).info.run_id
        params = [Param(k, v) for k, v in _flatten(_plain_config(config) or {}).items()]
        for start in range(0, len(params), 100):  # log_batch takes at most 100 params per call
            self._client.log_batch(self.run_id, params=params[start : start + 100])

    def log(self, data: Mapping[str, float], step: int) -> None:
        now = int(time.time() * 1000)
        metrics = [self._metric_cls(k.replace("@", "_at_"), float(v), now, step) for k, v in data.items()]
        for start in range(0, len(metrics), 1000):  # log_batch takes at most 1000 metrics per call
            self._client.log_batch(self.run_id, metrics=metrics[start : start + 1000])

    def finish(self) -> None:
        self._client.set_terminated(self.run_id)


def parse_logger_backends(backends: str | Sequence[str] | None) -> list[str]:
    """`trainer.logger` (a name, a list of names, or None) as known backend names, in order, deduplicated."""
    if backends is None:
        return []
    names = [backends] if isinstance(backends, str) else [str(name) for name in backends]
    unknown = [name for name in names if name not in LOGGER_BACKENDS]
    if unknown:
        raise ValueError(f"trainer.logger: unknown backend(s) {unknown}; valid: "
                         f"{', '.join(LOGGER_BACKENDS.names())}")
    return list(dict.fromkeys(names))


class Tracking:
    """Sends each step's metrics to the backends in `default_backend` (verl's class); files go under `log_dir`."""

    def __init__(self, project_name: str, experiment_name: str,
                 default_backend: str | Sequence[str] | None = "console", config: Mapping[str, Any] | None = None,
                 log_dir: str | os.PathLike | None = None) -> None:
        self.backend_names = parse_logger_backends(default_backend)
        self._finished = False
        log_dir_str = os.fspath(log_dir) if log_dir is not None else None
        self.loggers: dict[str, LoggerBackend] = {}
        try:
            for name in self.backend_names:
                self.loggers[name] = LOGGER_BACKENDS.get(name)(project_name, experiment_name, config, log_dir_str)
        except BaseException:
            self.finish()  # close what was opened before the failing backend
            raise

    def log(self, data: Mapping[str, Any], step: int, backend: Sequence[str] | None = None) -> None:
        """Log `data` at `step` to every backend, or only to those named in `backend`."""
        scalars = {key: _as_scalar(key, value) for key, value in data.items()}
        for name, logger in self.loggers.items():
            if backend is None or name in backend:
                logger.log(scalars, step)

    def rewind(self, keep_through: int) -> None:
        """Before a resumed run logs: move metrics.jsonl's lines after step `keep_through` (-1: all) aside, with a
        warning, and hide TensorBoard's events of those steps; wandb and MLflow keep what they received."""
        tensorboard = self.loggers.get("tensorboard")
        if isinstance(tensorboard, TensorboardLogger):
            tensorboard.rewind(keep_through)
        file_logger = self.loggers.get("file")
        if isinstance(file_logger, FileLogger):
            moved = file_logger.rewind(keep_through)
            if moved:
                since = f"of steps after {keep_through}" if keep_through >= 0 else "(this run starts afresh)"
                _logger.warning("%s: moved %d line(s) %s, which this run logs again, to %s%s", file_logger.path,
                                moved, since, file_logger.path.name, ROLLED_BACK_SUFFIX)

    def finish(self) -> None:
        """Close every backend once; later calls do nothing."""
        if self._finished:
            return
        self._finished = True
        for logger in self.loggers.values():
            logger.finish()

    def __enter__(self) -> Tracking:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.finish()


class StepProgress:
    """A tqdm bar over training steps showing chosen metrics of the last step: `postfix` maps a label to
    (metric key, format spec); the default shows the RL score and step time."""

    RL_POSTFIX: Mapping[str, tuple[str, str]] = {"score": ("critic/score/mean", ".3f"),
                                                  "step_s": ("timing_s/step", ".2f")}

    def __init__(self, total_steps: int, initial_step: int = 0, file: TextIO | None = None, desc: str = "Training",
                 postfix: Mapping[str, tuple[str, str]] | None = None) -> None:
        self._postfix = dict(self.RL_POSTFIX if postfix is None else postfix)
        self._bar = tqdm(total=total_steps, initial=initial_step, desc=desc, unit="step",
                         file=file, dynamic_ncols=file is None)

    def update(self, step: int, metrics: Mapping[str, Any] | None = None) -> None:
        metrics = metrics or {}
        shown = {label: format(float(metrics[key]), spec)
                 for label, (key, spec) in self._postfix.items() if key in metrics}
        self._bar.update(step - self._bar.n)
        # refresh now, past tqdm's redraw throttle: a step takes seconds, so every step is worth a redraw
        self._bar.set_postfix(shown, refresh=True)

    def close(self) -> None:
        self._bar.close()
