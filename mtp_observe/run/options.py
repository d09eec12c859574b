"""The replay's options and what they resolve to: the samplers scored, the drafters, the head's variants, the
serving numerics; the observer a caller hears progress through.

Contract: `ReplayOptions` (what `replay`'s flags set), `check_options(opts)` (one line per refusal, before any work),
`default_profiles`, `recorded_fallback`, `session_sampler` (which sampler each session is scored with: pipeline.py's
docstring), `drafter_roster`, `head_variants`, `serving_for`; `Observer` (the callbacks; the default does nothing).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..errors import OptionError
from ..model.checkpoint import CheckpointInfo
from ..model.target import RECORDED


@dataclass(frozen=True)
class ReplayOptions:
    k: int = 4
    chunk_size: int = 2048
    device: str = "auto"
    dtype: str = "auto"
    profiles: tuple = ()  # SamplingProfile; empty means the built-in ones and the checkpoint's generation_config
    recorded_with: str | None = None  # the profile the traffic was recorded with, as declared (--recorded-with)
    on_error: str = "fail"
    max_sessions: int | None = None
    resume: bool = False
    overwrite: bool = False
    device_map: str | None = None  # "auto": spread the target over every visible GPU (accelerate)
    head_engine: str = "vllm"  # --head-reading: whose reading of the head to replay (families.head_reading)
    template: object = None  # sessions.templates.TemplateOverrides: --chat-template / --template-kwargs (None: the checkpoint's)
    drafters: tuple = ("mtp",)  # --drafters, drafters.roster names in the order given
    ngram: object = None  # drafters.ngram.NgramConfig (--ngram MIN,MAX); None: vLLM's defaults
    suffix: object = None  # drafters.suffix.SuffixConfig (--suffix-*); None: vLLM's defaults
    grammar: str | None = None  # --grammar: "tools" (tool calls under their grammar, drafting/grammar.py); None: off
    serve_device: str = "h100"  # --serve-device: the GPU whose vLLM numerics the run describes (serving.py)
    fp8_activations: str | None = None  # --fp8-activations dynamic|none; None: what vLLM runs on the serve device
    part_sessions: int = 256  # sessions per part file at most (parts.py; 1: a part per session, as before grouping)
    shard: object = None  # shards.Shard (--shard I/N, --shard-by): replay that shard of the input; None: all of it
    ray: object = None  # cluster.RayOptions (--ray, --replicas, --gpus-per-replica); None: replay in this process
    trees: tuple = ()  # tree.TreeConfig (--tree S,TOPK,T), replayed beside the chain (head_variants.py)
    head_precisions: tuple = ()  # --head-precision: precisions.PRECISIONS names, the head re-run at each (what-ifs)
    draft_p_min: tuple = ()  # --draft-p-min: thresholds in [0, 1] for the confidence-stopped what-if (the report's)
    target_engine: object = None  # model.engine_target.EngineInfo (--target-engine URL): the target's layers run there


class Observer:
    """Progress callbacks; the CLI draws a progress bar from them. The default does nothing."""

    def estimate(self, estimate) -> None:
        """The work ahead (estimate.Estimate), before the first session; said as the replay's first line. An
        observer that does not override this is not given one: the estimate's calibration (about 2 s on the model)
        is skipped for a caller that would drop it (generation.Observer does the same)."""

    def start(self, sessions: int, tokens: int | None = None) -> None:
        """The sessions this process will handle (and, when known up front — a Ray job renders them first — their
        tokens)."""

    def session_start(self, session_id: str, tokens: int, requests: int, work=None) -> None:
        """A session is about to be replayed: its tokens (all its requests') and requests; work: its
        estimate.ReplayWork (what the progress line's ETA counts), None when no estimate was made."""

    def request(self, index: int) -> None:
        """Request `index` (0-based) of the current session starts."""

    def tokens(self, n: int) -> None:
        """n more tokens of the current session are computed (a prefill chunk)."""

    def reused(self, n: int) -> None:
        """n tokens of the current request are done without being computed: the prefix shared with the request before."""

    def session(self, session_id: str, tokens: int, skipped: bool) -> None:
        """A session ended: replayed, skipped, or (no session_start before it) found finished by --resume."""

    def replayed(self, session_id: str, tokens: int, requests: int) -> None:
        """A session replayed elsewhere (a replica of a Ray job, cluster.py) is done: its tokens count as this job's."""

    def warn(self, message: str) -> None: ...

    def note(self, message: str) -> None: ...


MAX_K = 32  # a chain longer than this is accepted to its end almost never, and costs [anchors, K] memory


def check_options(opts: ReplayOptions) -> None:
    import re

    if opts.k < 1:
        raise OptionError(f"--k {opts.k}: draft depth must be at least 1")
    if opts.k > MAX_K:
        raise OptionError(f"--k {opts.k}: draft depth is at most {MAX_K} (acceptance at depth k is a product of k "
                          "acceptances; engines draft 1-8)")
    if opts.chunk_size < 1:
        raise OptionError(f"--chunk-size {opts.chunk_size}: must be at least 1")
    if opts.part_sessions < 1:
        raise OptionError(f"--part-sessions {opts.part_sessions}: must be at least 1 (sessions per part file)")
    if opts.on_error not in ("fail", "skip"):
        raise OptionError(f"--on-error {opts.on_error}: expected fail or skip")
    if opts.device_map not in (None, "auto"):
        raise OptionError(f"--device-map {opts.device_map}: only auto is supported (accelerate places the layers)")
    if opts.max_sessions is not None and opts.max_sessions < 1:
        raise OptionError(f"--max-sessions {opts.max_sessions}: must be at least 1")
    for theta in opts.draft_p_min:
        if not (isinstance(theta, (int, float)) and 0.0 <= theta <= 1.0):
            raise OptionError(f"--draft-p-min {theta}: a threshold is a probability, 0 to 1 (0: fixed K; 1: never draft)")
    if len(set(opts.draft_p_min)) != len(opts.draft_p_min):
        raise OptionError("--draft-p-min: a threshold repeats; give each once")
    if (opts.head_precisions or opts.draft_p_min) and "mtp" not in opts.drafters:
        which = "--head-precision" if opts.head_precisions else "--draft-p-min"
        raise OptionError(f"{which} re-runs or reads the MTP head, which --drafters {','.join(opts.drafters)} leaves "
                          "out; add mtp to --drafters")
    names = [p.name for p in opts.profiles]
    for name in names:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise OptionError(f"--sampling {name}=...: profile names are letters, digits and _ (they become column names)")
    if len(set(names)) != len(names):
        raise OptionError(f"--sampling: profile names repeat ({', '.join(names)}); give each a distinct name")
    if RECORDED in names:
        raise OptionError(f"--sampling {RECORDED}=...: '{RECORDED}' is the profile of each session's own sampler; "
                          "pick another name")
    if opts.recorded_with is not None and opts.recorded_with not in names:
        raise OptionError(f"--recorded-with {opts.recorded_with}: no such profile; name one of {', '.join(names)} "
                          "or give NAME=T,TOP_P,TOP_K[,...]")


def default_profiles(model_dir: Path) -> tuple:
    """The built-in profiles (the Qwen3.5 card's four and greedy) and the checkpoint's generation_config
    sampler when it has one (the sampler vLLM serves requests that set none with)."""
    from ..model.target import BUILTIN_PROFILES, generation_config_profile

    generation = generation_config_profile(model_dir)
    return BUILTIN_PROFILES + ((generation,) if generation is not None else ())


def recorded_fallback(opts: ReplayOptions, model_dir: Path) -> tuple:
    """(profile, name) of the sampler for sessions without their own meta.sampling: the declared one,
    else the checkpoint's generation_config, else vLLM's neutral defaults (T = 1, nothing truncated)."""
    from ..model.target import VLLM_DEFAULTS, generation_config_profile

    if opts.recorded_with is not None:
        return next(p for p in opts.profiles if p.name == opts.recorded_with), opts.recorded_with
    generation = generation_config_profile(model_dir)
    if generation is not None:
        return generation, "generation_config"
    return VLLM_DEFAULTS, "vllm_defaults"


def session_sampler(session, fallback, server_default):
    """(profile named `recorded`, source) for one session: its meta.sampling (vLLM SamplingParams names; a key
    absent or null takes the server's default, `server_default`: generation_config, else vLLM's) or, without
    one, the fallback."""
    from ..model.target import SAMPLING_PARAMS, profile_from_params
    from ..sessions.reading import SessionError

    sampling = session.meta.get("sampling") if isinstance(session.meta, dict) else None
    if not isinstance(sampling, dict) or all(sampling.get(k) is None for k in SAMPLING_PARAMS):
        return fallback.renamed(RECORDED), "fallback"
    try:
        return profile_from_params(RECORDED, sampling, server_default), "session"
    except ValueError as e:
        raise SessionError(session.path, session.line, session.id, f"meta.{e}; fix it or drop meta.sampling") from None


def serving_for(opts: ReplayOptions, info: CheckpointInfo | None):
    """--serve-device and --fp8-activations resolved for the checkpoint (serving.serving_numerics); --fp8-activations
    for a checkpoint that is not block-FP8 is refused (vLLM quantises the activations of FP8 linears only)."""
    from ..model.serving import serving_numerics

    quantized = info is not None and info.quantization is not None
    if opts.fp8_activations is not None and not quantized:
        what = "a model-free replay loads no weights" if info is None else "the checkpoint is not block-FP8"
        raise OptionError(f"--fp8-activations {opts.fp8_activations}: {what}, so no activation is quantised; "
                          "drop the option")
    return serving_numerics(opts.serve_device, opts.fp8_activations, quantized)


def roster_draft_ks(name: str, k: int) -> tuple[int, ...]:
    from ..drafting.drafters.roster import draft_ks

    return draft_ks(name, k)


def written_draft_ks(opts: ReplayOptions, roster, variants) -> list[int] | None:
    """The depth of every block of rows a replay writes per anchor (parts.py checks a part's rows by them): the
    roster's drafters, the trees and the stepwise layer rule (variants), Kmax for each --head-precision; None for an
    mtp-only run without them. What manifest.row_draft_ks reads back from run.json; a Ray job's driver checks its
    parts with it too (cluster.py)."""
    if tuple(roster.names) == ("mtp",) and not variants and not opts.head_precisions:
        return None
    return [kk for n in roster.names for kk in roster_draft_ks(n, opts.k)] + variants.draft_ks \
        + [opts.k] * len(opts.head_precisions)


def head_variants(opts: ReplayOptions, info: CheckpointInfo | None):
    """The run's head_variants.Variants: --tree's configurations, and the stepwise layer rule for a head with several
    MTP layers (none for a model-free replay)."""
    from ..drafting.head_variants import Variants, variants_for

    if info is None:
        return Variants()
    if opts.trees and info.geometry.head != "mtp":
        # tree.py grows SGLang's trees from the Qwen heads' post-norm state; a NextN head (MLA or GLM's GQA, its
        # engine's fed-back state, docs/nextn.md) has no tree replay yet, so it is refused before any work.
        raise OptionError(f"--tree {opts.trees[0].name.removeprefix('tree:')}: tree drafts are replayed for the Qwen3.5-family "
                          f"MTP heads only, not {info.model_type}'s NextN head (docs/trees.md); drop --tree")
    return variants_for(tuple(opts.trees), info.geometry.num_layers, opts.k)


def drafter_roster(opts: ReplayOptions):
    """The run's drafters.roster.Roster from --drafters, --ngram and the --suffix-* options."""
    from ..drafting.drafters.roster import Roster

    return Roster(tuple(opts.drafters), opts.k, opts.ngram, opts.suffix, grammar=opts.grammar)


def check_model_free(opts: ReplayOptions, roster) -> None:
    """What a replay of model-free drafters only refuses (replay and replay --dry-run alike)."""
    if roster.needs_model:
        return
    if opts.profiles or opts.recorded_with:
        raise OptionError(f"--sampling and --recorded-with score the target's sampler, which a replay of model-free "
                          f"drafters only ({', '.join(roster.names)}) does not run; add mtp to --drafters, or drop them")
    if opts.trees:
        raise OptionError(f"--tree grows the MTP head's tree drafts, which a replay of model-free drafters only "
                          f"({', '.join(roster.names)}) does not run; add mtp to --drafters, or drop --tree")


def check_head_options(opts: ReplayOptions, info: CheckpointInfo | None) -> tuple:
    """(serving numerics, head variants) of the run, refusing at once what the checkpoint cannot take: --tree on a
    NextN head, a --head-precision whose rows a format cannot store, --fp8-activations of a checkpoint that is not
    block-FP8. replay and replay --dry-run share it, so a dry run refuses what the run would."""
    serving = serving_for(opts, info)
    variants = head_variants(opts, info)
    if info is not None and opts.head_precisions:
        from ..model.precisions import head_recipes

        head_recipes(info, opts.head_precisions)  # a shape a format cannot store is refused before anything is written
    return serving, variants
