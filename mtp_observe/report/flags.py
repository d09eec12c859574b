"""The serve flags a verdict stands for: vLLM's `--speculative-config` and SGLang's arguments at a K, as the
report's serve line prints them (only when the verdict serves; otherwise the best K's, labelled not recommended) and
as `export` writes them (engines/exports.py).

Contract:
    serve_lines(report) -> list[str]        the vLLM / SGLang flags of the verdict's K to run, only when it serves
    what_if_lines(report) -> list[str]      otherwise the best K's flags, labelled "not recommended"
    vllm_speculative_config(k, drafter, params), report_speculative_config(report, k), dynamic_config(report),
    sglang_args(k), reading_note(report, engine): the pieces both use.
Sources (the keys; no key here is invented): engines/exports.py's docstring.
"""

from __future__ import annotations

import json
import math

from . import Report

# vLLM's suffix-decoding keys and the run.json drafters.suffix parameter each one is (tables.py)
_VLLM_SUFFIX_KEYS = (("suffix_decoding_max_tree_depth", "max_tree_depth"),
                     ("suffix_decoding_max_cached_requests", "max_cached_requests"),
                     ("suffix_decoding_max_spec_factor", "max_spec_factor"),
                     ("suffix_decoding_min_token_prob", "min_token_prob"))


VLLM_DRAFTERS = ("mtp", "ngram", "suffix")  # the run's drafters vLLM serves (its "method"); not the hybrids


# Arctic's cache takes -1 for "no limit" and refuses more than 2^31 - 1 (arctic_inference/suffix_decoding/cache.py
# SuffixDecodingCache.__init__); vLLM refuses < 0 (vllm/config/speculative.py:1746-1750 `_validate_suffix_decoding`).
# 2^31 - 1 cached requests is what both accept that never evicts: the unlimited cache the run measured.
UNLIMITED_CACHED_REQUESTS = 0x7FFFFFFF


def drafter_runner(manifest: dict, drafter: str) -> str:
    """The vLLM model runner the run's drafter rows describe (run.json drafters.NAME.runner, drafters/roster.py);
    a run written before it has none: its n-gram and suffix rows followed V1's rules, its mtp rows V2's."""
    entry = (manifest.get("drafters") or {}).get(drafter) or {}
    runner = entry.get("runner") if isinstance(entry, dict) else None
    return runner if runner in ("v1", "v2") else ("v2" if drafter == "mtp" else "v1")


def vllm_unservable(drafter: str, params: dict | None) -> str | None:
    """Why vLLM cannot serve the drafter as the run measured it (None: it can): a hybrid, or suffix decoding with
    an Arctic option vLLM has no key for (max_spec_offset: vLLM never passes it, vllm/v1/spec_decode/suffix_decoding.py
    leaves SuffixDecodingCache.speculate's default 0.0)."""
    if drafter not in VLLM_DRAFTERS:
        return f"vLLM serves no {drafter} drafter"
    offset = (params or {}).get("max_spec_offset") or 0.0
    if drafter == "suffix" and offset != 0:
        return (f"the run's suffix drafter used --suffix-max-spec-offset {offset:g}, and vLLM has no such option (it "
                "always drafts with offset 0); replay with --suffix-max-spec-offset 0 to measure what vLLM serves")
    return None


def vllm_speculative_config(k: int, drafter: str = "mtp", params: dict | None = None) -> dict | None:
    """vLLM's --speculative-config for the run's drafter at draft length K (static); None for a drafter vLLM cannot
    serve as measured (vllm_unservable). ngram and suffix carry the run's own parameters (run.json drafters); a
    suffix cache without a limit (negative) becomes UNLIMITED_CACHED_REQUESTS, which vLLM accepts."""
    params = params or {}
    if vllm_unservable(drafter, params) is not None:
        return None
    if drafter == "mtp":
        return {"method": "mtp", "num_speculative_tokens": k}
    if drafter == "ngram":
        return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": params["prompt_lookup_min"],
                "prompt_lookup_max": params["prompt_lookup_max"]}
    config = {"method": "suffix", "num_speculative_tokens": k,
              **{key: params[name] for key, name in _VLLM_SUFFIX_KEYS if name in params}}
    if config.get("suffix_decoding_max_cached_requests", 0) < 0:
        config["suffix_decoding_max_cached_requests"] = UNLIMITED_CACHED_REQUESTS
    return config


def report_speculative_config(report: Report, k: int) -> dict | None:
    drafter = report.drafter
    return vllm_speculative_config(k, drafter, (report.manifest.get("drafters") or {}).get(drafter))


# Where vLLM drops num_speculative_tokens_per_batch_size (a warning, then the static num_speculative_tokens):
# vllm/config/vllm.py:1110-1127 `_maybe_disable_dynamic_sd_for_data_parallel` (data_parallel_size > 1, every
# method) and :1088-1108 `_maybe_disable_dynamic_sd_for_v1` (V1 runner, methods other than ngram, eagle, eagle3,
# mtp, draft_model, dflash: suffix decoding, which always runs on V1, vllm/config/vllm.py:3053-3087).
DYNAMIC_LIMITS = ("vLLM drops num_speculative_tokens_per_batch_size with a warning and serves the static "
                  "num_speculative_tokens under data parallelism (data_parallel_size > 1, any method) and for suffix "
                  "decoding (its V1 runner does not support it); with tensor parallelism alone it applies")


def dynamic_config(report: Report) -> dict | None:
    """vLLM's dynamic speculative decoding config from the report's schedule over batch sizes (report.batch,
    cost.schedule: `num_speculative_tokens_per_batch_size`, K capped at `num_speculative_tokens`), when the
    schedule changes K across batch sizes (one range is the static config) and the drafter is MTP (the limits of
    DYNAMIC_LIMITS, stated wherever the schedule is written)."""
    b = report.batch
    if b is None or report.drafter != "mtp" or len(b.schedule) < 2:
        return None
    return b.speculative_config


def sglang_args(k: int) -> list[str]:
    """SGLang's chain MTP flags at K: K draft steps, top-1, K + 1 verified tokens (the committed one included)."""
    return ["--speculative-algorithm", "NEXTN", "--speculative-num-steps", str(k), "--speculative-eagle-topk", "1",
            "--speculative-num-draft-tokens", str(k + 1)]


def _json(obj) -> str:
    return json.dumps(obj, separators=(", ", ": "))


def reading_note(report: Report, engine: str) -> str | None:
    """Where `engine` reads this run's head otherwise than the run replayed it (NextN heads: families.head_reading),
    in one line, or None. A run without head_reading (schema_version 2) replayed a Qwen head, read alike by both."""
    from ..model.families import ENGINE_NAMES, FAMILIES, head_reading

    m = report.manifest
    ran = m.get("head_reading")
    model_type = (m.get("model") or {}).get("model_type")
    if not isinstance(ran, dict) or model_type not in FAMILIES or ran.get("engine") == engine:
        return None
    theirs = head_reading(model_type, engine)
    diffs = []
    if bool(ran.get("zero_position_0_embedding")) != theirs.zero_position_0_embedding:
        diffs.append("zeroes the embedding at position 0" if theirs.zero_position_0_embedding else
                     "keeps the embedding at position 0 (the run zeroed it)")
    if ran.get("fed_back_state") != theirs.fed_back:
        diffs.append(f"feeds the {theirs.fed_back.replace('_', '-')} state back at chain step 2 and on (the run: "
                     f"{str(ran.get('fed_back_state')).replace('_', '-')})")
    if not diffs:
        return None
    name = ENGINE_NAMES[engine]
    return (f"this run replayed the {model_type} head as {ENGINE_NAMES.get(ran.get('engine'), ran.get('engine'))} "
            f"{ran.get('engine_version')} reads it; "
            f"{name} {theirs.version} {' and '.join(diffs)}: replay --head-reading {engine} to measure what {name} serves "
            "(docs/nextn.md)")


def _flag_lines(report: Report, k: int, lead: str, full: bool) -> list[str]:
    """vLLM's (and SGLang's, for MTP) flags at K after `lead`; full: the dynamic schedule and SGLang's line too."""
    drafter = report.drafter
    config = report_speculative_config(report, k)
    if config is None:
        why = vllm_unservable(drafter, (report.manifest.get("drafters") or {}).get(drafter))
        return [f"{lead} no engine flag ({why}{'' if drafter in VLLM_DRAFTERS else '; nor does SGLang'})"]
    env = "VLLM_USE_V2_MODEL_RUNNER=0 " if drafter == "ngram" and drafter_runner(report.manifest, drafter) == "v1" else ""
    lines = [f"{lead} {env}vllm serve MODEL --speculative-config '{_json(config)}'"]
    note = reading_note(report, "vllm") if drafter == "mtp" else None
    if note is not None:
        lines.append(f"  note: {note}")
    if not full:
        return lines
    dynamic = dynamic_config(report)
    if dynamic is not None:
        lines.append(f"  vLLM by batch size (dynamic speculative decoding; dropped under data parallelism): "
                     f"--speculative-config '{_json(dynamic)}'")
    if drafter == "mtp":
        lines.append("  SGLang: python -m sglang.launch_server --model-path MODEL " + " ".join(sglang_args(k)))
        note = reading_note(report, "sglang")
        if note is not None:
            lines.append(f"  note: {note}")
    return lines


def _what(report: Report) -> str:
    return "MTP" if report.drafter == "mtp" else f"the {report.drafter} drafter"


def serve_lines(report: Report) -> list[str]:
    """The engines' flags of the verdict's K to run, for people — only when the verdict serves (GO at a K whose
    speedup beats 1: Verdict.serves); otherwise none: nothing recommends a serve line the verdict does not."""
    v = report.verdict
    if not v.serves:
        return []
    return _flag_lines(report, v.run_k, f"serve {_what(report)} at K={v.run_k}:", full=True)


def what_if_lines(report: Report) -> list[str]:
    """When the verdict does not serve but the best K's speedup beats 1 on its point estimate: the flags it would
    take, labelled "not recommended" (report --details). None when the verdict serves or nothing pays."""
    v, k = report.verdict, report.best_k
    speedup = float(report.overall.value.speedup[k - 1])
    if v.serves or not (math.isfinite(speedup) and speedup > 1.0):
        return []
    return _flag_lines(report, k, f"not recommended ({v.status}, K to run 0): {_what(report)} at the best K={k} would "
                                  "be:", full=False)
