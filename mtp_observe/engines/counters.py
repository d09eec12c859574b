"""Counters: what a serving engine counted on the traffic, read from its own files and checked to be counts.

Contract:
    read_engine_metrics(text, where) -> EngineMeasurement
        vLLM Prometheus text (read_prometheus), vLLM per-request JSON (read_per_request) or SGLang decode log lines
        (read_sglang_log), told by the content; anything that cannot be a measurement — a value that is not a
        finite, non-negative whole count, per-position counts above the drafts or increasing with the position,
        accepted tokens above the drafted ones, an acceptance length below 1 — is an EngineMetricsError naming the
        value and its line, never a number to judge
    check_acceptance_length(measured, k)
        a mean acceptance length outside [1, K + 1] is no measurement at draft length K

A file of several /metrics scrapes is read as the window between the first and the last (counters are cumulative:
their difference in time order is what the engine counted in between; a sum would count the traffic twice).
Memory is bounded by the file: nothing is allocated from a size the file claims (a num_spec_tokens of 10^12 is
checked against its histogram's length first).

Sources (read with the search tools; file at the stored commit):
- vLLM counters: vllm-project/vllm@ee4ceaae vllm/v1/spec_decode/metrics.py (`vllm:spec_decode_num_drafts`,
  `_num_draft_tokens`, `_num_accepted_tokens`, `_num_accepted_tokens_per_pos` with label `position` 0-based;
  labels `model_name`, `engine`); SpecDecodingStats.observe_draft (@016a8587): a step adds 1 to num_drafts, its
  drafts to num_draft_tokens, its accepted drafts to num_accepted_tokens and 1 to per_pos[i] for each i below them
  — so per_pos sums to num_accepted_tokens, never increases with i and never exceeds num_drafts. The `_total`
  suffix (and a `_created` sample) is prometheus_client's (prometheus/client_python@00859b30
  prometheus_client/metrics.py, Counter._child_samples).
- vLLM per-request JSON: vllm-project/vllm@02cf515f docs/features/speculative_decoding/acceptance_metrics.md —
  `metrics.speculative_decoding` (null for n > 1) with `acceptance_histogram` ("Dense list of length
  num_spec_tokens + 1; index j is the number of steps that accepted exactly j draft tokens"), `num_spec_steps`
  ("the sum of the histogram"), `num_accepted_draft_tokens`, `num_draft_tokens` (after grammar-invalidated drafts
  are subtracted), `num_spec_tokens`.
- SGLang: the scheduler's decode log line, `accept len: {spec_accept_length:.2f}, ` (sgl-project/sglang
  python/sglang/srt/managers/scheduler.py and its metrics mixin) = (accepted drafts + one per request-step) /
  request-steps over the log interval, the same convention as vLLM's mean acceptance length.

Imports no torch (the report's rule).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass

import numpy as np

from ..errors import EngineMetricsError


@dataclass(frozen=True)
class EngineMeasurement:
    """What an engine counted on the traffic. per_position is None where the source has no per-position counts."""

    source: str  # "vllm-prometheus" | "vllm-per-request" | "sglang-log"
    k: int | None  # the draft length the engine ran (None: the source does not say)
    steps: float | None  # verify steps (num_drafts)
    per_position: np.ndarray | None  # [K] per_pos / num_drafts
    mean_acceptance_length: float
    detail: str  # for people: what was summed
    model_name: str | None = None  # the counters' model_name label (vLLM /metrics), None where the source has none
    draft_tokens: float | None = None  # num_draft_tokens (vLLM /metrics; None where the source has none)


VLLM_COUNTERS = ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens",
                 "vllm:spec_decode_num_accepted_tokens", "vllm:spec_decode_num_accepted_tokens_per_pos")
_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)(?:\s+(?P<time>\S+))?\s*$")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')
_SGLANG_ACCEPT = re.compile(r"accept len: ([^\s,]+)")
_POSITION = re.compile(r"0|[1-9][0-9]{0,5}")  # vLLM's position label: 0 .. num_speculative_tokens - 1
MAX_COUNT = 2 ** 53  # counts are exact in a float below this; no engine has counted more events


class _NotACount(ValueError):
    """A value that cannot be a count of events (its reason, for the caller to place)."""


def _kind(value) -> str:
    return {str: "a string", list: "a list", dict: "an object", type(None): "null", bool: "a boolean"}.get(
        type(value), type(value).__name__)


def _count(value) -> int:
    """A non-negative whole number of events: an int, or a float holding one (Prometheus writes 12.0)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _NotACount(f"{_kind(value)}, not a count")
    if isinstance(value, float) and not math.isfinite(value):
        raise _NotACount(f"{value}, not a count (a counter holds a finite number of events)")
    if value < 0:
        raise _NotACount(f"{value:g}, a negative count")
    if value != int(value):
        raise _NotACount(f"{value:g}, not a whole number of events")
    if value > MAX_COUNT:
        raise _NotACount(f"{value:.3g}, more events than any engine has counted (above 2^53)")
    return int(value)


def _labels(text: str | None, where: str, number: int) -> dict[str, str]:
    if not text:
        return {}
    out, pos = {}, 0
    while pos < len(text):
        m = _LABEL.match(text, pos)
        if m is None:
            raise EngineMetricsError(f"{where}:{number}: cannot read the labels {{{text[:80]}}} (Prometheus text format: "
                                     'name{label="value",...} number)')
        out[m.group(1)] = m.group(2)
        pos = m.end()
    return out


@dataclass(frozen=True)
class _Sample:
    value: int
    time: float | None  # the sample's timestamp (ms since the epoch), when the line carries one
    line: int


def _prometheus_samples(text: str, where: str) -> tuple[dict, set]:
    """Every spec-decode counter sample, each checked to be a count: {(counter, with _total, labels): [_Sample]} in
    file order, and the model names seen."""
    series: dict[tuple, list[_Sample]] = {}
    models = set()
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#") or not line.startswith("vllm:spec_decode_"):
            continue
        m = _SAMPLE.match(line)
        if m is None:
            raise EngineMetricsError(f"{where}:{number}: not a Prometheus sample line: {line[:80]}")
        name = m.group("name")
        if name.endswith("_created"):
            continue
        total = name.endswith("_total")
        base = name[: -len("_total")] if total else name
        if base not in VLLM_COUNTERS:
            continue
        try:
            value = _count(float(m.group("value")))
        except ValueError as e:
            why = str(e) if isinstance(e, _NotACount) else f"{m.group('value')[:40]!r}, not a number"
            raise EngineMetricsError(f"{where}:{number}: {name} is {why}; this is not a measurement") from None
        stamp = None
        if m.group("time") is not None:
            try:
                stamp = float(m.group("time"))
            except ValueError:
                stamp = math.nan
            if not math.isfinite(stamp):
                raise EngineMetricsError(f"{where}:{number}: {name} has the timestamp {m.group('time')[:40]!r}, not a "
                                         "number (Prometheus text: name{labels} value [milliseconds])")
        labels = _labels(m.group("labels"), where, number)
        if "model_name" in labels:
            models.add(labels["model_name"])
        if base == VLLM_COUNTERS[3] and not _POSITION.fullmatch(labels.get("position", "")):
            raise EngineMetricsError(f"{where}:{number}: {name} without a numeric position label (0, 1, ...)")
        series.setdefault((base, total, tuple(sorted(labels.items()))), []).append(_Sample(value, stamp, number))
    return series, models


def _scrape_window(series: dict, where: str) -> tuple[dict, int, tuple[int, int]]:
    """{key: (count, line)} over the file's scrapes, how many scrapes, and the lines of the first and the last.

    One scrape: the counters as they are. Several (the same counter and labels again: `curl /metrics >> file`):
    counters are cumulative, so what the engine counted between the first and the last scrape is their
    difference, in time order (the samples' timestamps, else the order in the file) — never their sum. A counter
    that falls between scrapes was reset (the engine restarted), and the difference is no count: refused."""
    scrapes = {len(samples) for samples in series.values()}
    if len(scrapes) > 1:
        raise EngineMetricsError(f"{where}: the spec-decode counters appear {min(scrapes)} to {max(scrapes)} times: not "
                                 "whole scrapes of /metrics; give one scrape, or several whole ones")
    n = scrapes.pop()
    out, lines = {}, None
    for (base, total, labels), samples in series.items():
        stamped = [s.time is not None for s in samples]
        if n > 1 and any(stamped) and not all(stamped):
            raise EngineMetricsError(f"{where}:{samples[0].line}: some samples of {base} carry a timestamp and some do "
                                     "not, so their time order is unknown; keep the scrapes as /metrics wrote them")
        ordered = sorted(samples, key=lambda s: s.time) if all(stamped) else samples
        for a, b in zip(ordered, ordered[1:]):
            if b.value < a.value:
                shown = base + ("_total" if total else "") + ("{" + ",".join(f'{k}="{v}"' for k, v in labels) + "}" if labels else "")
                raise EngineMetricsError(f"{where}:{b.line}: {shown} falls from {a.value:,} (line {a.line}) to {b.value:,}: a "
                                         "counter never decreases, so the engine restarted between these scrapes or they "
                                         "are out of time order; compare scrapes of one engine run, in order")
        out[(base, total, labels)] = (ordered[-1].value - ordered[0].value if n > 1 else ordered[-1].value, ordered[-1].line)
        if lines is None or base == VLLM_COUNTERS[0]:
            lines = (ordered[0].line, ordered[-1].line)
    return out, n, lines


def _check_counters(drafts: int, draft_tokens: int, accepted: int, per_pos: list[int], where: str, at: dict) -> None:
    """What vLLM's counting makes true of any window (vllm/v1/spec_decode/metrics.py, SpecDecodingStats.observe_draft:
    a step adds 1 to num_drafts, its drafts to num_draft_tokens, its accepted drafts to num_accepted_tokens and 1
    to per_pos[i] for each i below them): counts that break it are no measurement, and are refused."""
    k = len(per_pos)
    if drafts <= 0:
        raise EngineMetricsError(f"{where}: vllm:spec_decode_num_drafts is {drafts:,} (over the window read): the engine "
                                 "made no speculative step; send the traffic first")
    for p, c in enumerate(per_pos):
        if c > drafts:
            raise EngineMetricsError(f"{where}:{at[p]}: vllm:spec_decode_num_accepted_tokens_per_pos position {p} is {c:,}, "
                                     f"above vllm:spec_decode_num_drafts ({drafts:,}, line {at['drafts']}): a position is "
                                     "accepted at most once per draft; this is not a measurement")
        if p and c > per_pos[p - 1]:
            raise EngineMetricsError(f"{where}:{at[p]}: vllm:spec_decode_num_accepted_tokens_per_pos position {p} is {c:,}, "
                                     f"more than position {p - 1} ({per_pos[p - 1]:,}, line {at[p - 1]}): a draft token is "
                                     "accepted only after every one before it, so the counts never increase; this is "
                                     "not a measurement")
    if accepted > draft_tokens:
        raise EngineMetricsError(f"{where}:{at['accepted']}: vllm:spec_decode_num_accepted_tokens is {accepted:,}, above "
                                 f"vllm:spec_decode_num_draft_tokens ({draft_tokens:,}, line {at['draft_tokens']}): an "
                                 "engine accepts only tokens it drafted; this is not a measurement")
    if sum(per_pos) != accepted:
        raise EngineMetricsError(f"{where}:{at['accepted']}: vllm:spec_decode_num_accepted_tokens is {accepted:,}, but its "
                                 f"per-position counts add up to {sum(per_pos):,}: vLLM counts each accepted token once, "
                                 "at its position; these are not one engine's counters")
    if not drafts <= draft_tokens <= k * drafts:  # fewer than K: a model-free drafter's short drafts (engines.check)
        raise EngineMetricsError(f"{where}: {draft_tokens:,} draft tokens in {drafts:,} drafts is not 1 to {k} per draft: "
                                 "a step with a draft drafts at least one token and at most K; this is not a measurement")


def read_prometheus(text: str, where: str) -> EngineMeasurement:
    """vLLM's /metrics text: the four spec-decode counters, with or without `_total`, summed over `engine`; every
    sample a count, several scrapes read as the window between the first and the last (_scrape_window), the
    window's counts checked against each other (_check_counters)."""
    series, models = _prometheus_samples(text, where)
    if len(models) > 1:
        raise EngineMetricsError(f"{where}: spec-decode counters of {len(models)} models ({', '.join(sorted(models))}); "
                                 "keep the lines of the model the run replayed")
    use_total = any(total for (_, total, _) in series)
    chosen = {key: samples for key, samples in series.items() if key[1] == use_total}
    window, scrapes, (first, last) = _scrape_window(chosen, where) if chosen else ({}, 1, (0, 0))
    got: dict[str, int] = {}
    positions: dict[int, int] = {}
    at: dict = {}  # what each check names: the line of a counter's (first engine's) last sample
    names = {VLLM_COUNTERS[0]: "drafts", VLLM_COUNTERS[1]: "draft_tokens", VLLM_COUNTERS[2]: "accepted"}
    for (base, _, labels), (value, line) in sorted(window.items(), key=lambda item: item[1][1]):
        if base == VLLM_COUNTERS[3]:
            p = int(dict(labels)["position"])
            positions[p] = positions.get(p, 0) + value
            at.setdefault(p, line)
        else:
            got[base] = got.get(base, 0) + value
            at.setdefault(names[base], line)
    missing = [c for c in VLLM_COUNTERS[:3] if c not in got]
    if missing or not positions:
        absent = missing + ([] if positions else [VLLM_COUNTERS[3]])
        raise EngineMetricsError(f"{where}: no {', '.join(absent)} sample; expected vLLM's /metrics text with "
                                 "speculative decoding on")
    if sorted(positions) != list(range(len(positions))):
        shown = sorted(positions)[:12]
        raise EngineMetricsError(f"{where}: per-position counters for positions {shown}{' ...' if len(positions) > 12 else ''}; "
                                 f"expected 0..{len(positions) - 1}")
    drafts, draft_tokens, accepted = (got[c] for c in VLLM_COUNTERS[:3])
    per_pos = [positions[p] for p in range(len(positions))]
    _check_counters(drafts, draft_tokens, accepted, per_pos, where, at)
    k = len(per_pos)
    rates = np.array([c / drafts for c in per_pos])
    window_said = f"the window between {scrapes} scrapes (from line {first} to line {last}): " if scrapes > 1 else ""
    return EngineMeasurement(source="vllm-prometheus", k=k, steps=float(drafts), per_position=rates,
                             draft_tokens=float(draft_tokens),
                             mean_acceptance_length=1.0 + accepted / drafts, model_name=next(iter(models), None),
                             detail=f"vLLM counters{' (_total)' if use_total else ''}: {window_said}{drafts:,} drafts, "
                                    f"{accepted:,} accepted tokens")


def _documents(text: str, where: str):
    """A JSON value, or JSON lines (None when the text is neither)."""
    try:
        data = json.loads(text)
        return data if isinstance(data, list) else [data]
    except json.JSONDecodeError:
        pass
    except RecursionError:
        raise EngineMetricsError(f"{where}: JSON nested too deeply to be vLLM responses") from None
    out = []
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if line.startswith("data:"):
            line = line[len("data:"):].strip()
        if not line or line == "[DONE]":
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            return None
        except RecursionError:
            raise EngineMetricsError(f"{where}:{number}: JSON nested too deeply to be a vLLM response") from None
    return out


def _speculative_decoding(doc, where: str) -> dict | None:
    """A response's metrics.speculative_decoding object, None when it has none (metrics absent, or null for n > 1)."""
    if not isinstance(doc, dict):
        return None
    metrics = doc.get("metrics")
    if metrics is None:
        return None
    if not isinstance(metrics, dict):
        raise EngineMetricsError(f"{where}: metrics is {_kind(metrics)}, not an object (vLLM's per-request metrics)")
    sd = metrics.get("speculative_decoding")
    if sd is not None and not isinstance(sd, dict):
        raise EngineMetricsError(f"{where}: metrics.speculative_decoding is {_kind(sd)}, not an object")
    return sd


def _response_histogram(sd: dict, where: str) -> list[int]:
    """One response's acceptance histogram, checked against its own fields (vLLM acceptance_metrics.md: the
    histogram is num_spec_tokens + 1 long; num_spec_steps is its sum; num_accepted_draft_tokens is sum j·h[j];
    num_draft_tokens lies between those and num_spec_tokens per step). Nothing is allocated from a claimed size."""
    field = "metrics.speculative_decoding"

    def count(key, value):
        try:
            return _count(value)
        except _NotACount as e:
            raise EngineMetricsError(f"{where}: {field}.{key} is {e}; this is not a measurement") from None

    if "num_spec_tokens" not in sd or "acceptance_histogram" not in sd:
        raise EngineMetricsError(f"{where}: {field} lacks acceptance_histogram or num_spec_tokens")
    k = count("num_spec_tokens", sd["num_spec_tokens"])
    raw = sd["acceptance_histogram"]
    if not isinstance(raw, list):
        raise EngineMetricsError(f"{where}: {field}.acceptance_histogram is {_kind(raw)}, not a list of counts")
    if k < 1 or len(raw) != k + 1:
        raise EngineMetricsError(f"{where}: {field}.acceptance_histogram has {len(raw):,} entries where num_spec_tokens "
                                 f"{k:,} makes {k + 1:,} (steps that accepted 0..K drafts); this is not a measurement")
    hist = [count(f"acceptance_histogram[{j}]", x) for j, x in enumerate(raw)]
    steps, accepted = sum(hist), sum(j * h for j, h in enumerate(hist))
    for key, expected in (("num_spec_steps", steps), ("num_accepted_draft_tokens", accepted)):
        if sd.get(key) is not None and count(key, sd[key]) != expected:
            raise EngineMetricsError(f"{where}: {field}.{key} is {count(key, sd[key]):,}, but its acceptance_histogram "
                                     f"makes {expected:,}; this is not a measurement")
    if sd.get("num_draft_tokens") is not None and not accepted <= count("num_draft_tokens", sd["num_draft_tokens"]) <= k * steps:
        raise EngineMetricsError(f"{where}: {field}.num_draft_tokens is {count('num_draft_tokens', sd['num_draft_tokens']):,}, "
                                 f"outside {accepted:,} (the accepted drafts) .. {k * steps:,} (K per step); this is not a "
                                 "measurement")
    return hist


def read_per_request(docs: list, where: str) -> EngineMeasurement:
    """vLLM's per-request `metrics.speculative_decoding` objects (responses, a list of them, or JSON lines), summed."""
    hist: list[int] | None = None
    requests = 0
    for i, doc in enumerate(docs):
        at = f"{where}: response {i + 1}"
        sd = _speculative_decoding(doc, at)
        if sd is None:
            continue
        h = _response_histogram(sd, at)
        if hist is None:
            hist = [0] * len(h)
        if len(h) != len(hist):
            raise EngineMetricsError(f"{at}: num_spec_tokens {len(h) - 1} where earlier responses had {len(hist) - 1}; "
                                     "compare one static K")
        hist = [a + b for a, b in zip(hist, h)]
        requests += 1
    if hist is None:
        raise EngineMetricsError(f"{where}: no metrics.speculative_decoding in any response; start vLLM with "
                                 "--per-request-spec-decode-metrics summary")
    k, steps = len(hist) - 1, sum(hist)
    if steps == 0:
        raise EngineMetricsError(f"{where}: the {requests} responses made no speculative step")
    reaching = [sum(hist[j:]) for j in range(1, k + 1)]  # [K] steps accepting at least j drafts
    rates = np.array(reaching, dtype=np.float64) / steps
    accepted = sum(j * h for j, h in enumerate(hist))
    return EngineMeasurement(source="vllm-per-request", k=k, steps=float(steps), per_position=rates,
                             mean_acceptance_length=1.0 + accepted / steps,
                             detail=f"{requests} vLLM responses' acceptance histograms: {steps:,} steps")


def _sglang_values(text: str, where: str = "") -> list[float]:
    """The `accept len` of every SGLang decode log line; a value that cannot be one (not a number, NaN, below 1:
    the length counts the bonus token) is refused naming its line."""
    values = []
    for number, line in enumerate(text.splitlines(), start=1):
        m = _SGLANG_ACCEPT.search(line) if "Decode batch" in line else None
        if m is None:
            continue
        try:
            value = float(m.group(1))
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and value >= 1):
            raise EngineMetricsError(f"{where}:{number}: accept len {m.group(1)[:40]}: an acceptance length is a finite "
                                     "number of at least 1 (accepted drafts plus the bonus token per step); this is not "
                                     "a measurement")
        values.append(value)
    return values


def read_sglang_log(text: str, where: str) -> EngineMeasurement:
    """SGLang's decode log lines: `accept len` is (accepted drafts + 1) per request-step over one log interval;
    the intervals are averaged with equal weight (the line carries no step count)."""
    values = _sglang_values(text, where)
    if not values:
        raise EngineMetricsError(f"{where}: no 'Decode batch ... accept len: X' line; start SGLang with speculative "
                                 "decoding on and keep its log")
    return EngineMeasurement(source="sglang-log", k=None, steps=None, per_position=None,
                             mean_acceptance_length=float(np.mean(values)),
                             detail=f"mean of {len(values)} SGLang 'accept len' log lines (each one log interval's)")


def read_engine_metrics(text: str, where: str) -> EngineMeasurement:
    """The format is told by its content: vLLM counters, JSON responses, or SGLang decode log lines."""
    if "vllm:spec_decode_" in text:
        return read_prometheus(text, where)
    if _sglang_values(text, where):
        return read_sglang_log(text, where)
    docs = _documents(text, where)
    if docs:
        return read_per_request(docs, where)
    raise EngineMetricsError(f"{where}: neither vLLM /metrics text (vllm:spec_decode_*), vLLM responses with "
                             "metrics.speculative_decoding, nor SGLang log lines with 'accept len:'")


def check_acceptance_length(measured: EngineMeasurement, k: int) -> None:
    """A mean acceptance length counts the bonus token: it lies in [1, K + 1] at draft length K, or it is no
    measurement of that K (an SGLang log's, whose K comes from --k or the report)."""
    if not 1 <= measured.mean_acceptance_length <= k + 1:
        raise EngineMetricsError(f"the engine's mean acceptance length {measured.mean_acceptance_length:.3f} "
                                 f"({measured.detail}) lies outside [1, {k + 1}], all that K={k} drafts can make; this "
                                 "is not a measurement at that K (give the engine's draft length with --k)")
