"""Prometheus metrics: counters, gauges and histograms, and their rendering in the
Prometheus text exposition format (version 0.0.4), written by hand.

A metric is a family: a name, a help text, label names, and one value (or one
histogram) per set of label values. Most values are pushed where things happen
(`inc`, `set`, `observe`); a value another object already keeps (the runtime's
active generations, the session table's eviction count) is given as a `read`
callable instead and sampled when /metrics is scraped, so it can never drift
from its source.

`ServerMetrics` is the set llmd exposes; the API and the runtime feed it.
"""
from __future__ import annotations

import math
import re
from typing import Callable, Iterable

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


def format_value(value: float) -> str:
    """A sample value as the format spells it: integers without a fraction, +Inf, NaN."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if float(value).is_integer() and abs(value) < 2 ** 53:
        return str(int(value))
    return repr(float(value))


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\"", "\\\"").replace("\n", "\\n")


def _labels(pairs: Iterable[tuple[str, str]]) -> str:
    inner = ",".join(f'{name}="{_escape_label(value)}"' for name, value in pairs)
    return "{" + inner + "}" if inner else ""


class Metric:
    """A family of samples sharing a name, a help text and label names."""

    kind = ""

    def __init__(self, name: str, help: str, labels: tuple[str, ...] = ()):
        if not _METRIC_NAME.fullmatch(name):
            raise ValueError(f"invalid metric name {name!r}")
        for label in labels:
            if not _LABEL_NAME.fullmatch(label) or label.startswith("__") or label == "le":
                raise ValueError(f"invalid label name {label!r}")
        self.name, self.help, self.label_names = name, help, labels

    def _key(self, labels: dict[str, str]) -> tuple[str, ...]:
        if set(labels) != set(self.label_names):
            raise ValueError(f"{self.name} takes labels {self.label_names}, got {tuple(labels)}")
        return tuple(str(labels[n]) for n in self.label_names)

    def samples(self) -> list[tuple[str, list[tuple[str, str]], float]]:
        """(sample name, label pairs, value) for each sample of the family."""
        raise NotImplementedError

    def render(self) -> str:
        lines = [f"# HELP {self.name} {_escape_help(self.help)}", f"# TYPE {self.name} {self.kind}"]
        lines += [f"{name}{_labels(pairs)} {format_value(value)}" for name, pairs, value in self.samples()]
        return "\n".join(lines) + "\n"


class _Scalar(Metric):
    """A counter or gauge: one number per label set, or a `read` callable (unlabelled)."""

    def __init__(self, name: str, help: str, labels: tuple[str, ...] = ()):
        super().__init__(name, help, labels)
        self.values: dict[tuple[str, ...], float] = {} if labels else {(): 0.0}
        self.read: Callable[[], float] | None = None

    def samples(self):
        if self.read is not None:
            return [(self.name, [], float(self.read()))]
        return [(self.name, list(zip(self.label_names, key)), value)
                for key, value in sorted(self.values.items())]


class Counter(_Scalar):
    kind = "counter"

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        if amount < 0:
            raise ValueError("a counter only goes up")
        key = self._key(labels)
        self.values[key] = self.values.get(key, 0.0) + amount


class Gauge(_Scalar):
    kind = "gauge"

    def set(self, value: float, **labels: str) -> None:
        self.values[self._key(labels)] = float(value)


class Histogram(Metric):
    """Observations counted into cumulative buckets (upper bounds, `le`), with sum and count."""

    kind = "histogram"

    def __init__(self, name: str, help: str, buckets: tuple[float, ...]):
        super().__init__(name, help)
        if list(buckets) != sorted(set(buckets)) or not buckets:
            raise ValueError("histogram buckets must be increasing")
        self.bounds = tuple(buckets) + ((math.inf,) if buckets[-1] != math.inf else ())
        self.counts = [0] * len(self.bounds)  # per bucket, not cumulative
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        for i, bound in enumerate(self.bounds):
            if value <= bound:
                self.counts[i] += 1
                break
        self.sum += value
        self.count += 1

    def samples(self):
        out, cumulative = [], 0
        for bound, n in zip(self.bounds, self.counts):
            cumulative += n
            out.append((self.name + "_bucket", [("le", format_value(bound))], cumulative))
        out.append((self.name + "_sum", [], self.sum))
        out.append((self.name + "_count", [], self.count))
        return out


class Registry:
    """Metrics in the order they were made; renders them all."""

    def __init__(self) -> None:
        self.metrics: dict[str, Metric] = {}

    def _add(self, metric: Metric) -> Metric:
        if metric.name in self.metrics:
            raise ValueError(f"metric {metric.name} is already registered")
        self.metrics[metric.name] = metric
        return metric

    def counter(self, name: str, help: str, labels: tuple[str, ...] = ()) -> Counter:
        return self._add(Counter(name, help, labels))

    def gauge(self, name: str, help: str, labels: tuple[str, ...] = ()) -> Gauge:
        return self._add(Gauge(name, help, labels))

    def histogram(self, name: str, help: str, buckets: tuple[float, ...]) -> Histogram:
        return self._add(Histogram(name, help, buckets))

    def render(self) -> str:
        return "".join(m.render() for m in self.metrics.values())


class ServerMetrics:
    """What llmd exposes at /metrics."""

    def __init__(self) -> None:
        r = self.registry = Registry()
        self.requests = r.counter("llmd_requests_total", "HTTP requests answered, by route and status.",
                                  ("route", "status"))
        self.prompt_tokens = r.counter("llmd_prompt_tokens_total",
                                       "Prompt tokens of generations, cached ones included.")
        self.cached_tokens = r.counter("llmd_prompt_tokens_cached_total",
                                       "Prompt tokens reused from a session's KV cache instead of prefilled.")
        self.generated_tokens = r.counter("llmd_generated_tokens_total", "Tokens generated.")
        self.draft_tokens = r.counter("llmd_draft_tokens_total",
                                      "Drafted tokens verified by speculative decoding, by drafter.", ("drafter",))
        self.draft_accepted = r.counter("llmd_draft_tokens_accepted_total",
                                        "Drafted tokens that speculative decoding accepted, by drafter.", ("drafter",))
        self.first_token = r.histogram(
            "llmd_time_to_first_token_seconds",
            "Seconds from a generation's admission to its first token.",
            (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0))
        self.inter_token = r.histogram(
            "llmd_inter_token_latency_seconds",
            "Seconds between consecutive tokens of one generation.",
            (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0))
        self.generations_active = r.gauge("llmd_generations_active",
                                          "Generations in the scheduler (prefilling or decoding).")
        self.generations_queued = r.gauge(
            "llmd_generations_queued",
            "Requests waiting for their session, busy with an earlier request of the same session.")
        self.sessions_in_use = r.gauge("llmd_sessions_in_use",
                                       "Session slots taken by named and temporary sessions.")
        self.sessions_capacity = r.gauge("llmd_sessions_capacity",
                                         "Session slots for named and temporary sessions (scratch slot excluded).")
        self.engine_sessions = r.gauge(
            "llmd_engine_sessions_live", "Engine sessions not yet freed, as the engine counts them.")
        self.table_sessions = r.gauge(
            "llmd_sessions_held", "Engine sessions the session table holds, scratch included; equal to "
                                  "llmd_engine_sessions_live whenever no engine call is queued.")
        self.kv_bytes = r.gauge("llmd_kv_cache_bytes",
                                "KV cache bytes sessions hold: their blocks (a shared block once) and rings.")
        self.kv_blocks = r.gauge("llmd_kv_blocks_live", "KV blocks held by sessions, each block once.")
        self.prefix_cache_hits = r.counter(
            "llmd_prefix_cache_hits_total",
            "Generations whose prompt prefix came from the prefix cache (blocks another session computed).")
        self.prefix_cache_misses = r.counter(
            "llmd_prefix_cache_misses_total",
            "Generations that looked in the prefix cache and found no more than their own session held.")
        self.blocks_shared = r.gauge(
            "llmd_prefix_cache_blocks_shared",
            "Holds of a KV block that another session holds too: blocks stored once instead of twice.")
        self.bytes_saved = r.gauge("llmd_prefix_cache_bytes_saved",
                                   "KV bytes sessions would hold without sharing blocks, beyond what they hold.")
        self.retired_blocks = r.gauge("llmd_prefix_cache_retired_blocks",
                                      "KV blocks no session holds, kept for the prefix cache (LRU).")
        self.retired_bytes = r.gauge("llmd_prefix_cache_retired_bytes", "Bytes of those retired blocks.")
        self.snapshots = r.gauge("llmd_prefix_cache_recurrent_snapshots",
                                 "Recurrent states kept at block boundaries, so that a hybrid model's prefix "
                                 "resumes from them (LRU).")
        self.snapshot_bytes = r.gauge("llmd_prefix_cache_recurrent_snapshot_bytes",
                                      "Bytes of those recurrent snapshots.")
        self.evictions = r.counter("llmd_session_evictions_total",
                                   "Idle named sessions evicted to make room for a new one.")
        self.model_load = r.gauge("llmd_model_load_seconds", "Seconds it took to read and load the model.")
        self.kv_bytes_per_token = r.gauge(
            "llmd_kv_cache_bytes_per_token", "KV cache bytes per position of a session (the layers that attend "
                                             "every position), by how keys and values are stored (--kv-type).",
            ("type_k", "type_v"))
        self.session_files_saved = r.counter("llmd_session_files_saved_total",
                                             "Session files written to --session-dir.")
        self.session_files_loaded = r.counter("llmd_session_files_loaded_total",
                                              "Session files loaded into a session (warm from disk).")
        self.session_files_refused = r.counter(
            "llmd_session_files_refused_total",
            "Session files not loaded: damaged, of another model, context or format version, or unreadable.")
        self.session_files_failed = r.counter(
            "llmd_session_files_failed_total",
            "Session files that could not be written (disk full, read-only directory, over --session-dir-max).")
        self.session_files_conflicts = r.counter(
            "llmd_session_file_conflicts_total",
            "Session files not written because another instance sharing --session-dir had written a newer "
            "version of the session (the session is reloaded from that file before its next request here).")
        self.session_dir_bytes = r.gauge("llmd_session_dir_bytes", "Bytes of session files in --session-dir.")

        # The model-server protocol of the Kubernetes Gateway API Inference Extension
        # (what its endpoint picker and llm-d's scheduler scrape), under the names it
        # recommends, which are vLLM's. The older name of the KV gauge is exported too,
        # for pickers that still read it by default.
        self.gateway_queued = r.gauge("vllm:num_requests_waiting",
                                      "Generation requests waiting to start (llmd_generations_queued counts only "
                                      "those waiting for their session).")
        self.gateway_running = r.gauge("vllm:num_requests_running", "Generations being prefilled or decoded.")
        self.gateway_kv_usage = r.gauge(
            "vllm:kv_cache_usage_perc",
            "KV cache utilisation as a fraction (1 = full): the larger of the KV bytes sessions hold over the KV "
            "memory of all session slots, and the slots in use over all slots (a full table evicts).")
        self.gateway_kv_usage_old = r.gauge("vllm:gpu_cache_usage_perc",
                                            "The same as vllm:kv_cache_usage_perc, under its former name.")

    def render(self) -> str:
        return self.registry.render()
