"""TrainingMonitor: the MindSpore Callback that reads cb_params once per step and hands a sample to probes."""

from __future__ import annotations

import atexit
import logging
import os
import signal
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from mindspore.train import Callback

from ms_exporter.actions.runner import ActionRunner
from ms_exporter.config import ConfigError, MonitorConfig, load_config
from ms_exporter.monitor.breach_watch import ThresholdWatcher
from ms_exporter.monitor.errors import Breaker, ErrorSink
from ms_exporter.monitor.output_layout import LayoutResolver
from ms_exporter.monitor.ranks import RankInfo, detect_rank
from ms_exporter.monitor.sample import BatchCounter, StepSample, read_loss
from ms_exporter.monitor.step_history import StepHistory
from ms_exporter.monitor.store import HistogramSeries, MetricStore, Series
from ms_exporter.probes.base import Probe
from ms_exporter.probes.evaluation import EvalProbe
from ms_exporter.probes.grad_norm import GradNormProbe
from ms_exporter.probes.identity import publish_identity
from ms_exporter.probes.layernorm import LayerNormProbe
from ms_exporter.probes.learning_rate import LearningRateProbe
from ms_exporter.probes.loss import LossProbe
from ms_exporter.probes.loss_scale import LossScaleProbe
from ms_exporter.probes.memory import MemoryProbe
from ms_exporter.probes.progress import ProgressProbe
from ms_exporter.probes.step_time import StepTimeProbe
from ms_exporter.probes.throughput import ThroughputProbe
from ms_exporter.probes.weight_norm import WeightNormProbe
from ms_exporter.sinks.file_sd import FileSdTarget
from ms_exporter.sinks.jsonl import JsonlWriter, series_key
from ms_exporter.sinks.prometheus import PrometheusEndpoint

logger = logging.getLogger("ms_exporter")

HOOK_BUCKETS = (1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 0.1, 1.0)
HOOKS = ("train_begin", "step_begin", "step_end", "train_end", "eval_end")
# Steps are published to the probes in batches at most this often (every step when steps take longer): one
# loop over many recorded steps costs a fraction of as many hook calls, whose code is cold after each training
# step. 1 s rather than 0.25 s: on the demo model a record cost ~44 µs in batches of ~31 against ~78 µs in
# batches of ~8 (docs/development.md), and no Prometheus scrape interval tells 1 s of delay apart.
PUBLISH_SECONDS = 1.0
MAX_PENDING_STEPS = 1024  # and at least every this many steps, so that very fast steps cannot pile up
# Per-step values that go into each JSONL step record besides the sample itself.
STEP_COLUMN_FAMILIES = ("mindspore_train_loss_smoothed", "mindspore_train_loss_consecutive_increases",
                        "mindspore_train_learning_rate", "mindspore_train_samples_per_second",
                        "mindspore_train_tokens_per_second", "mindspore_train_grad_norm")


class TrainingMonitor(Callback):
    """Serves this rank's training health on /metrics (and JSON Lines with the `local` backend).

    `config` is a YAML path, a dict, a MonitorConfig or None; keyword arguments override it
    (precedence: defaults < file < MS_EXPORTER_* environment < keywords). Construction validates everything
    and raises ConfigError; after that no hook raises into training.
    """

    def __init__(self, config: Any = None, **overrides: Any) -> None:
        super().__init__()
        self.config: MonitorConfig = load_config(config, **overrides)
        self._enabled = self.config.enable
        self._endpoint: PrometheusEndpoint | None = None
        self._jsonl: JsonlWriter | None = None
        self._closed = False
        if not self._enabled:
            return
        _configure_logging(self.config.log_level)
        self.rank: RankInfo = detect_rank()
        self.store = MetricStore((("rank", str(self.rank.rank)), ("project", self.config.project)))
        self._build_probes()
        self._actions = ActionRunner(self.config, self.store) if self.config.actions.any else None
        self._errors = ErrorSink(self.store, ("callback", "sampler", *(p.name for p in self._step_probes),
                                              *(("actions",) if self._actions is not None else ()),
                                              *self.config.backend, *(("file_sd",) if self.config.file_sd_dir else ()),
                                              *(("pushgateway",) if self.config.pushgateway.url else ())))
        self._breaker = Breaker(self._errors, self.store)
        hooks = self.store.histogram("mindspore_exporter_callback_duration_seconds",
                                     "The monitor's own cost per hook call.", HOOK_BUCKETS)
        self._hook_cost = {hook: hooks.histogram(hook=hook) for hook in HOOKS}
        self._thresholds = ThresholdWatcher(self.store, self.config.all_bounds(), self.config.warmup_steps)
        self._layouts = LayoutResolver()
        self._batch = BatchCounter(self.config.attention_mask_column, self.config.input_ids_column)
        # Raw step records waiting for publication. Only the training thread publishes them (and close() or a
        # signal handler once training is over or interrupted): probes evaluate LR schedules and read tensors,
        # and MindSpore calls from a second thread during a step can deadlock (seen: a schedule evaluated from
        # a background thread while a graph ran).
        self._pending: deque[tuple[Any, ...]] = deque()
        self._publish_lock = threading.Lock()
        self._reset_step_state()
        self._sampler_stop = threading.Event()
        self._sampler: threading.Thread | None = None
        self._previous_handlers: dict[int, Any] = {}
        self._signal_pid = os.getpid()
        self._in_signal = False
        if "local" in self.config.backend:
            self._jsonl = JsonlWriter(self.store, self.config.save_dir, self.rank.rank, self.config.project,
                                      self.config.interval, self.config.max_file_mb, self.config.max_files,
                                      self._errors.absorb, self._breaker)
        self._file_sd: FileSdTarget | None = None
        # The live page's ring of recent steps (GET / and /api/series on the rank's endpoint).
        self._history = StepHistory(self.store, self.config.all_bounds()) if "prometheus" in self.config.backend \
            else None
        if "prometheus" in self.config.backend:
            self._endpoint = self._serve()
            if self._endpoint is not None and self.config.file_sd_dir:
                self._file_sd = self._register(self.config.file_sd_dir, self._endpoint.port)
        self._otlp: Any = self._start_otlp() if "otlp" in self.config.backend else None
        self._pushgateway: Any = None
        if self.config.pushgateway.url:
            from ms_exporter.sinks.pushgateway import PushgatewaySink

            self._pushgateway = PushgatewaySink(self.store, self.config.pushgateway, self._errors.absorb)
        atexit.register(self.close)

    # -- construction helpers ------------------------------------------------------------------------
    def _build_probes(self) -> None:
        config, store = self.config, self.store
        if config.wants("global_rank"):
            import mindspore

            publish_identity(store, self.rank, str(mindspore.get_context("device_target")), mindspore.__version__,
                             config.tags)
        probes: list[Probe] = [ProgressProbe(store)]
        if config.wants("loss"):
            probes.append(LossProbe(store, config.loss_window))
        if config.wants("lr"):
            probes.append(LearningRateProbe(store))
        if config.wants("step_time"):
            probes.append(StepTimeProbe(store))
        if config.wants("samples_per_second") or config.wants("tokens_per_second"):
            probes.append(ThroughputProbe(store, config.wants("samples_per_second"), config.wants("tokens_per_second")))
        probes.append(LossScaleProbe(store, config.grad_norm.every_n_steps))
        if config.grad_norm.enable:
            probes.append(GradNormProbe(store, config.grad_norm))
        if config.weight_norm:
            probes.append(WeightNormProbe(store, config.grad_norm))
        if config.layernorm.enable:
            probes.append(LayerNormProbe(store, config.layernorm))
        self._memory: MemoryProbe | None = None
        if config.wants("memory_usage"):
            self._memory = MemoryProbe(store, config.warmup_steps, config.memory_window, config.interval)
            probes.append(self._memory)
        self._eval = EvalProbe(store) if config.wants("eval") else None
        self._step_probes = probes

    def _serve(self) -> PrometheusEndpoint | None:
        port = self.config.port + self.rank.local_rank if self.config.port else 0
        try:
            endpoint = PrometheusEndpoint(self.store, self.config.bind_address, port, self._errors.absorb,
                                          self.config.web, self._history)
        except OSError as exc:
            # Not even a free port on this address: training goes on without an endpoint.
            self._errors.absorb("prometheus", exc)
            logger.error("ms_exporter: cannot serve metrics on %s (%s); training continues without /metrics",
                         self.config.bind_address, exc.strerror or exc)
            return None
        logger.info("ms_exporter: rank %d serves metrics at %s", self.rank.rank, endpoint.url)
        return endpoint

    def _start_otlp(self) -> Any:
        try:
            from ms_exporter.sinks.otlp import OtlpExport
        except ImportError as exc:
            raise ConfigError([f"monitor_config.backend: otlp needs the OpenTelemetry SDK ({exc.name} is missing); "
                               "install it with: pip install 'ms-exporter[otlp]'"]) from exc
        try:
            return OtlpExport(self.store, self.config.otlp, self.rank, self.config.project, self._errors.absorb)
        except Exception as exc:  # a bad endpoint or TLS setting: train without OTLP, say so once
            self._errors.absorb("otlp", exc)
            return None

    def _register(self, directory: str, port: int) -> FileSdTarget | None:
        target = FileSdTarget(directory, self.config.project, self.rank, self.config.bind_address, port)
        try:
            target.write()
        except OSError as exc:
            self._errors.absorb("file_sd", exc)
            return None
        logger.info("ms_exporter: registered %s for Prometheus file_sd", target.path)
        return target

    def _reset_step_state(self) -> None:
        self._kept: Any = None
        self._published = 0.0
        self._last_step = 0
        self._steps_done = 0
        self._step_began: float | None = None
        self._previous_end: float | None = None
        self._data_wait: float | None = None
        self._column_keys: tuple[str, ...] = ()
        self._columns: tuple[Series, ...] = ()
        self._columns_version = -1

    # -- public ------------------------------------------------------------------------------------------
    @property
    def url(self) -> str | None:
        """The actual http://host:port/metrics of this rank (None when disabled or without prometheus)."""
        return self._endpoint.url if self._endpoint is not None else None

    @property
    def jsonl_path(self) -> str | None:
        return str(self._jsonl.path) if self._jsonl is not None else None

    def close(self) -> None:
        """Stop the threads, flush the JSONL file and stop serving. Safe to call twice; runs at exit."""
        if self._closed or not self._enabled:
            return
        self._closed = True
        self._stop_sampler()
        self._guard("callback", self._publish, None, True)
        self._restore_signal_handlers()  # a closed monitor must not stay in the signal path
        if self._jsonl is not None:
            self._jsonl.close()
        if self._file_sd is not None:
            self._file_sd.remove()
        if self._pushgateway is not None:
            self._pushgateway.close()
        if self._otlp is not None:
            self._otlp.close()
        if self._endpoint is not None:
            self._endpoint.close()

    # -- hooks ---------------------------------------------------------------------------------------------
    def on_train_begin(self, run_context: Any) -> None:
        if not self._enabled:
            return
        with self._cost("train_begin", "callback"):
            cb_params = run_context.original_args()
            self._publish(None, wait=True)  # anything left from an earlier run belongs to that run
            self._reset_step_state()
            self._last_step = int(cb_params.get("cur_step_num", 0) or 0)
            self._batch.bind(cb_params.get("train_dataset"))
            self._layouts.bind(cb_params.get("train_network"))
            if self._actions is not None:  # first: lr_backoff wraps a schedule before anything compiles or reads it
                lr_probe = next((p for p in self._step_probes if p.name == "learning_rate"), None)
                self._guard("actions", self._actions.on_train_begin, cb_params, lr_probe)
            for probe in self._step_probes:
                self._guard(probe.name, probe.on_train_begin, cb_params)
            if self._jsonl is not None:
                self._jsonl.record_event("train_begin", step=self._last_step)
                self._jsonl.start()
            self._start_sampler()
            if self._pushgateway is not None:
                self._pushgateway.start()
            self._install_signal_handlers()

    def on_train_step_begin(self, run_context: Any) -> None:
        if not self._enabled:
            return
        began = time.perf_counter()
        self._step_began = began
        if self._previous_end is not None:
            self._data_wait = began - self._previous_end
        try:
            # Keep what counting the batch needs (shape, mask): it is counted when the step is published.
            self._kept = self._batch.keep(run_context.original_args().get("train_dataset_element"))
        except Exception as exc:
            self._kept = None
            self._errors.absorb("callback", exc)
        self._hook_cost["step_begin"].observe(time.perf_counter() - began)

    def on_train_step_end(self, run_context: Any) -> None:
        """Reads the loss (which ends the step) and keeps a raw record; the probes see it when it is published.

        Publishing runs every record since the last one through the probes, thresholds, history and JSON Lines
        in one loop, at most every PUBLISH_SECONDS (every step when steps are slower, or when actions are on):
        the per-step cost on the training thread is then one loss read and one append.
        """
        if not self._enabled:
            return
        entered = time.perf_counter()
        try:
            cb_params = run_context.original_args()
            reading = time.perf_counter()
            outputs = cb_params["net_outputs"]  # cb_params is a dict; its attribute access is a slower detour
            loss = read_loss(outputs)
            # The loss read synchronises the device (GRAPH mode does not), so the step ends here.
            ended = time.perf_counter()
            entered += ended - reading  # the wait for the device belongs to the step, not to the monitor's cost
            kept = self._kept if self._kept is not None else self._batch.keep(cb_params.get("train_dataset_element"))
            # Only a tuple has more for the probes than the loss already read: a lone loss tensor is let go now.
            self._pending.append((cb_params["cur_step_num"], cb_params["cur_epoch_num"], loss,
                                  self._step_began if self._step_began is not None else entered, ended,
                                  self._data_wait, kept, outputs if isinstance(outputs, (tuple, list)) else None))
            if (ended - self._published >= PUBLISH_SECONDS or self._actions is not None
                    or len(self._pending) >= MAX_PENDING_STEPS):
                self._published = ended
                self._publish(run_context)
        except Exception as exc:
            self._errors.absorb("callback", exc)
        finally:
            self._step_began = None
            self._data_wait = None
            self._kept = None
            self._previous_end = now = time.perf_counter()
            self._hook_cost["step_end"].observe(now - entered)

    def publish(self) -> None:
        """Run the steps recorded since the last publication through the probes now (tests, end of training)."""
        if self._enabled:
            self._guard("callback", self._publish, None, True)

    def _publish(self, run_context: Any, wait: bool = False) -> None:
        # Without `wait`, whoever finds the lock taken leaves the records to the loop that holds it (or to the
        # next publication): the training thread never waits, and a signal that arrives while its own thread
        # publishes does not start a second loop.
        if not (self._publish_lock.acquire(True, 5.0) if wait else self._publish_lock.acquire(False)):
            return
        try:
            wall_offset = time.time() - time.perf_counter()  # the hook keeps perf_counter times only
            pending = self._pending
            while pending:
                record = pending.popleft()
                try:
                    self._publish_step(record, wall_offset, run_context)
                except Exception as exc:  # one unreadable record costs that record, not the others
                    self._errors.absorb("callback", exc)
        finally:
            self._publish_lock.release()

    def _publish_step(self, record: tuple[Any, ...], wall_offset: float, run_context: Any) -> None:
        step, epoch, loss, began, ended, data_wait, kept, outputs = record
        step, epoch = int(step), int(epoch)
        steps = step - self._last_step if step > self._last_step else 1
        self._last_step = step
        self._steps_done += steps
        samples, tokens = self._batch.count(kept, steps)
        sample = StepSample(step, epoch, steps, loss, ended - began, data_wait, samples, tokens,
                            ended + wall_offset, ended, outputs, self._layouts.resolve(outputs))
        for probe in self._step_probes:
            try:
                probe.on_step(sample)
            except Exception as exc:
                if self._breaker.failed(probe.name, exc, self._steps_done):
                    self._step_probes = [p for p in self._step_probes if p is not probe]
        self._thresholds.check_step(self._steps_done)
        if run_context is not None and self._actions is not None and "actions" not in self._breaker.disabled:
            try:
                self._actions.on_step(sample, run_context)
            except Exception as exc:
                self._breaker.failed("actions", exc, self._steps_done)
        if self._history is not None:
            self._history.record(sample)
        if self._jsonl is not None:
            self._jsonl.record_step(sample, *self._column_values())

    def on_train_epoch_end(self, run_context: Any) -> None:
        if self._enabled and self._actions is not None:  # not timed: only actions use this hook
            self._guard("actions", self._actions.on_epoch_end, run_context, self._last_step)

    def on_train_end(self, run_context: Any) -> None:
        if not self._enabled:
            return
        with self._cost("train_end", "callback"):
            self._finish_run()

    def on_eval_end(self, run_context: Any) -> None:
        if not self._enabled or self._eval is None:
            return
        with self._cost("eval_end", "eval"):
            self._publish(None, wait=True)
            cb_params = run_context.original_args()
            results = cb_params.get("eval_results") or cb_params.get("metrics")
            if isinstance(results, dict):
                self._eval.on_eval(results)
                if self._jsonl is not None:
                    self._jsonl.record_event("eval", step=self._last_step,
                                             metrics={str(k): _plain(v) for k, v in results.items()})

    def __exit__(self, *exc_info: Any) -> None:
        # MindSpore leaves the callback context on every exit from training, also when training raised
        # (on_train_end is not called then): flush and stop threads either way.
        if self._enabled and exc_info and exc_info[0] is not None:
            self._guard("callback", self._finish_run)

    # -- internals ----------------------------------------------------------------------------------------
    def _finish_run(self) -> None:
        self._stop_sampler()
        self._guard("callback", self._publish, None, True)
        for probe in self._step_probes:
            self._guard(probe.name, probe.on_train_end)
        self._restore_signal_handlers()
        if self._jsonl is not None:
            self._jsonl.record_event("train_end", step=self._last_step)
            self._jsonl.stop()
        if self._pushgateway is not None:
            self._pushgateway.run_ended()

    def _column_values(self) -> tuple[tuple[str, ...], tuple[float, ...]]:
        """(keys, values) of the per-step series; the keys tuple is shared until a series appears."""
        if self._columns_version != self.store.version:
            self._columns_version = self.store.version
            columns = []
            for name in STEP_COLUMN_FAMILIES:
                family = self.store.get(name)
                for child in family.children() if family is not None else ():
                    if isinstance(child, Series):
                        columns.append((series_key(name, child), child))
            self._column_keys = tuple(key for key, _ in columns)
            self._columns = tuple(series for _, series in columns)
        return self._column_keys, tuple([series.value for series in self._columns])

    def _guard(self, component: str, func: Callable[..., Any], *args: Any) -> None:
        try:
            func(*args)
        except Exception as exc:
            self._errors.absorb(component, exc)

    def _cost(self, hook: str, component: str) -> _HookTimer:
        return _HookTimer(self._hook_cost[hook], self._errors, component)

    # -- slow sampling thread --------------------------------------------------------------------------
    def _start_sampler(self) -> None:
        if self._memory is None or (self._sampler is not None and self._sampler.is_alive()):
            return
        self._sampler_stop.clear()
        self._sampler = threading.Thread(target=self._sample_loop, name="ms_exporter-sampler", daemon=True)
        self._sampler.start()

    def _stop_sampler(self) -> None:
        self._sampler_stop.set()
        if self._sampler is not None:
            self._sampler.join(5.0)
            self._sampler = None

    def _sample_loop(self) -> None:
        tick = 0
        while self._memory is not None:
            tick += 1
            if "memory" not in self._breaker.disabled:
                try:
                    self._memory.sample_host()
                except Exception as exc:
                    self._breaker.failed("memory", exc, tick)
            self._guard("sampler", self._thresholds.check_slow)
            if self._sampler_stop.wait(self.config.interval):
                return

    # -- signals ---------------------------------------------------------------------------------------------
    def _install_signal_handlers(self) -> None:
        if ((self._jsonl is None and self._file_sd is None and self._pushgateway is None)
                or threading.current_thread() is not threading.main_thread()):
            return
        self._signal_pid = os.getpid()
        for signum in (signal.SIGTERM, signal.SIGINT):
            try:
                previous = signal.getsignal(signum)
                if previous == self._on_signal:
                    continue  # already ours (a train() inside train()): never chain to ourselves
                signal.signal(signum, self._on_signal)
                self._previous_handlers[signum] = previous
            except (ValueError, OSError) as exc:  # e.g. an embedding interpreter that owns signals
                self._errors.absorb("callback", exc)

    def _restore_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for signum, previous in list(self._previous_handlers.items()):
            if signal.getsignal(signum) == self._on_signal:
                signal.signal(signum, previous)
            del self._previous_handlers[signum]

    def _on_signal(self, signum: int, frame: Any) -> None:
        """Flush what is queued, then do what the previous handler would have done. Never swallow the signal."""
        if os.getpid() != self._signal_pid:
            # A process forked from the training process (a data-loader or summary worker) inherited this
            # handler: it owns neither the file nor the target, and must die or stop as it would without us.
            _default_action(signum)
            return
        if self._in_signal:
            # A handler installed after ours chained back to us: end the loop with the default action.
            _default_action(signum)
            return
        self._in_signal = True
        try:
            self._guard("callback", self._publish, None)
            if self._jsonl is not None:
                self._jsonl.record_event("signal", signal=signal.Signals(signum).name, step=self._last_step)
                self._jsonl.flush()
            if self._file_sd is not None:
                self._file_sd.remove()  # a stopped rank leaves discovery, not a dead target
            if self._pushgateway is not None:
                self._pushgateway.run_ended()  # a stopped job leaves its last numbers behind
            previous = self._previous_handlers.get(signum, signal.SIG_DFL)
            if callable(previous):
                previous(signum, frame)
            elif previous != signal.SIG_IGN:
                _default_action(signum)
        finally:
            self._in_signal = False


def _default_action(signum: int) -> None:
    """What Python does with SIGINT (KeyboardInterrupt) and the OS with anything else (SIGTERM ends the process)."""
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _configure_logging(level: str) -> None:
    """log_level applies to the `ms_exporter` logger. A training script rarely configures Python logging (MindSpore
    logs through its own channel), so without any handler our INFO lines would vanish: give them stderr then."""
    logger.setLevel(level)
    if not logger.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("[%(levelname)s] %(asctime)s %(message)s"))
        logger.addHandler(handler)
        logger.propagate = False


class _HookTimer:
    """Times a non-step hook into the cost histogram and absorbs anything it raises."""

    def __init__(self, histogram: HistogramSeries, errors: ErrorSink, component: str) -> None:
        self._histogram = histogram
        self._errors = errors
        self._component = component

    def __enter__(self) -> None:
        self._began = time.perf_counter()

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        self._histogram.observe(time.perf_counter() - self._began)
        if isinstance(exc, Exception):
            self._errors.absorb(self._component, exc)
        return isinstance(exc, Exception)


def _plain(value: Any) -> Any:
    try:
        return float(value)
    except (TypeError, ValueError):
        return str(value)
