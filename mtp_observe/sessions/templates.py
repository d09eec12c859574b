"""The chat template a replay renders with: the checkpoint's, or `--chat-template FILE` with `--template-kwargs JSON`
(SESSIONS.md: servers often override the checkpoint's template), recorded in run.json; and a bounded rendering, so a
template that loops or explodes is refused in one line instead of filling memory.

Contract: `template_overrides(chat_template, template_kwargs)` -> TemplateOverrides (checked: JSON object, no reserved
names, bounded depth); `bounded_rendering(template, given)` caps what one rendering may produce
(RENDER_FACTOR x the input's characters + RENDER_SLACK) and raises RenderingTooLarge past it.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import OptionError

# apply_chat_template's own parameters: not template variables, so --template-kwargs may not set them.
RESERVED_KWARGS = frozenset({"conversation", "messages", "tools", "documents", "chat_template", "add_generation_prompt",
                             "continue_final_message", "tokenize", "sanitize_control_tokens", "padding", "truncation",
                             "max_length", "return_tensors", "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs"})


@dataclass(frozen=True)
class TemplateOverrides:
    """A chat template to render with instead of the checkpoint's, and template variables."""

    chat_template: str | None = None  # the template's text
    chat_template_path: str | None = None  # where it came from, as given
    chat_template_sha256: str | None = None  # of the file's bytes
    kwargs: dict = field(default_factory=dict)  # template variables, e.g. {"enable_thinking": False}

    def manifest(self) -> dict | None:
        """run.json's "rendering" value: None when nothing is overridden."""
        if self.chat_template is None and not self.kwargs:
            return None
        template = {"path": self.chat_template_path, "sha256": self.chat_template_sha256} if self.chat_template is not None else None
        return {"chat_template": template, "template_kwargs": dict(self.kwargs)}


def template_overrides(chat_template: str | Path | None = None, template_kwargs: str | None = None) -> TemplateOverrides:
    """--chat-template FILE and --template-kwargs JSON -> TemplateOverrides; a bad value is an OptionError.

    The template must be a UTF-8 Jinja file that compiles; the kwargs a JSON object whose keys are
    template variables (not apply_chat_template's own parameters)."""
    import hashlib

    text = path = digest = None
    if chat_template is not None:
        path = str(chat_template)
        try:
            data = Path(chat_template).read_bytes()
        except OSError as e:
            raise OptionError(f"--chat-template {path}: cannot read it ({e.strerror}); give a Jinja chat template file")
        try:
            text = data.decode("utf-8-sig")
        except UnicodeDecodeError:
            raise OptionError(f"--chat-template {path}: not UTF-8 text; give a Jinja chat template file")
        import jinja2

        try:  # compiled the way apply_chat_template compiles it (its sandbox and extensions)
            from transformers.utils.chat_template_utils import _compile_jinja_template
        except ImportError:  # an older layout: the plain sandbox checks the syntax as well
            from jinja2.sandbox import ImmutableSandboxedEnvironment

            def _compile_jinja_template(t):
                return ImmutableSandboxedEnvironment(extensions=["jinja2.ext.loopcontrols"]).from_string(t)
        try:
            _compile_jinja_template(text)
        except jinja2.TemplateSyntaxError as e:
            raise OptionError(f"--chat-template {path}: line {e.lineno}: {e.message}; fix the template")
        digest = hashlib.sha256(data).hexdigest()
    kwargs: dict = {}
    if template_kwargs is not None:
        kwargs = _template_kwargs(template_kwargs)
        if not isinstance(kwargs, dict):
            raise OptionError(f"--template-kwargs {template_kwargs}: must be a JSON object of template variables, e.g. '{{\"enable_thinking\": false}}'")
        reserved = sorted(set(kwargs) & RESERVED_KWARGS)
        if reserved:
            raise OptionError(f"--template-kwargs: {reserved[0]} is not a template variable (apply_chat_template sets it); drop it")
    return TemplateOverrides(text, path, digest, kwargs)


MAX_KWARGS_DEPTH = 64  # template variables are flags and small structures; deeper is no template's input


def _template_kwargs(text: str):
    """--template-kwargs' JSON, bounded: NaN and infinities (not JSON; they would reach run.json), and nesting past
    MAX_KWARGS_DEPTH (a RecursionError in the parser or the template) are one line each."""
    shown = text if len(text) <= 80 else text[:77] + "..."

    def constant(name):
        raise ValueError(f"{name} is not a JSON number")

    try:
        value = json.loads(text, parse_constant=constant)
    except RecursionError:
        value = None
        deep = True
    except ValueError as e:
        raise OptionError(f"--template-kwargs {shown}: not JSON ({getattr(e, 'msg', e)}); "
                          "give an object, e.g. '{\"enable_thinking\": false}'")
    else:
        deep = _depth(value) > MAX_KWARGS_DEPTH
    if deep:
        raise OptionError(f"--template-kwargs {shown}: nested more than {MAX_KWARGS_DEPTH} levels deep; template "
                          "variables are flags and small objects")
    from ..outputs import non_finite_key

    found = non_finite_key(value)
    if found is not None:
        raise OptionError(f"--template-kwargs {shown}: {found} is not a finite number (1e400 overflows); give a JSON "
                          "number a float holds")
    return value


def _depth(value, limit: int = MAX_KWARGS_DEPTH + 1) -> int:
    """Nesting depth of a JSON value, counted no further than `limit` (iteratively: no recursion to exhaust)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, (dict, list)):
            deepest = max(deepest, depth)
            if depth < limit:
                stack.extend((child, depth + 1) for child in (node.values() if isinstance(node, dict) else node))
    return deepest


# A rendering is bounded by what it is given: a chat template lays out messages and tools with markup around them, so
# RENDER_FACTOR times the input's JSON plus RENDER_SLACK characters (the template's own text, markup per message) is
# far above any real template's output, and a template that loops (nested ranges, messages repeated) stops there, in
# the time and memory that many characters take, instead of rendering gigabytes.
RENDER_FACTOR = 4


RENDER_SLACK = 1_000_000


_RENDER_LIMIT = contextvars.ContextVar("render_limit", default=None)


class RenderingTooLarge(Exception):
    """A chat template's output ran past the bound (its message is the one line the session error carries)."""


def _bounded_concat(pieces) -> str:
    """jinja's Template.render joins the pieces the template yields with `environment.concat`; this one stops at
    the active bound (none outside `bounded_rendering`: "".join)."""
    bound = _RENDER_LIMIT.get()
    if bound is None:
        return "".join(pieces)
    limit, given = bound
    kept, size = [], 0
    for piece in pieces:
        size += len(piece)
        if size > limit:
            raise RenderingTooLarge(f"it renders more than {limit:,} characters from {given:,} of messages, tools and "
                                    f"variables ({RENDER_FACTOR}x plus {RENDER_SLACK:,}): a template that loops")
        kept.append(piece)
    return "".join(kept)


@contextlib.contextmanager
def bounded_rendering(template: str, given: int):
    """Within: the template's rendering stops past RENDER_FACTOR * given + RENDER_SLACK characters. The template is
    the one apply_chat_template compiles (transformers caches the compiled template by its text, so the bound set on
    its environment is the one it renders with); without that cache (another transformers) nothing is bounded."""
    try:
        from transformers.utils.chat_template_utils import _compile_jinja_template

        _compile_jinja_template(template).environment.concat = _bounded_concat
    except Exception:  # an older or newer layout, or a template that does not compile (apply_chat_template says why)
        pass
    token = _RENDER_LIMIT.set((RENDER_FACTOR * given + RENDER_SLACK, given))
    try:
        yield
    finally:
        _RENDER_LIMIT.reset(token)
