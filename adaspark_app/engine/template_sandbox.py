"""The sandbox a GGUF's chat template runs in: the template is untrusted input.

Jinja's immutable sandbox, and beyond it limits on what a template can make and how long it can
run: text repeated past MAX_REPEAT_CHARS, exponents past MAX_EXPONENT, a `+`, `~`, call, filter
or `join` making more than MAX_PROMPT_CHARS, and a prompt longer than that are refused before
they are made; a render runs in a thread of its own and is stopped past MAX_RENDER_S (a loop that
writes nothing, a macro calling itself twice). Every error a template raises, Jinja's or Python's,
is one line (`why`).

What a template may use is what Hugging Face's `apply_chat_template` gives it (transformers'
chat_template_utils), since GGUF templates are written for it: `raise_exception`,
`strftime_now` (gpt-oss, Mistral Small 3.2 and Solar write the date into the system message),
a `tojson` filter that writes JSON as Python's json does, the `break` and `continue` tags (Command
R7B, Kimi) and the `{% generation %}` block around an assistant turn (LFM2.5), which renders its
body (transformers uses it to mark the assistant's tokens for training).
"""

from __future__ import annotations

import ctypes
import functools
import json
import threading
from datetime import datetime
from typing import Any, Callable, Iterator

from jinja2 import Template, TemplateError, nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError


def _raise_exception(message: str) -> None:
    raise TemplateError(message)


def _strftime_now(fmt: str) -> str:
    """The local time now in `fmt` (transformers' and llama.cpp's `strftime_now`)."""
    return datetime.now().strftime(str(fmt))


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    """transformers' `tojson`: Python's json, not Jinja's HTML-safe one (which writes `<` as
    `\\u003c`)."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


class _GenerationBlock(Extension):
    """`{% generation %}...{% endgeneration %}`: its body, as rendered."""

    tags = {"generation"}

    def parse(self, parser: Any) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Callable[[], str]) -> str:
        return caller()


MAX_REPEAT_CHARS = 1 << 20  # what `text * n` in a template may make at most (a GGUF is untrusted)
MAX_EXPONENT = 1024  # and `x ** n`
MAX_PROMPT_CHARS = 64 << 20  # and a whole prompt (16M tokens of context are about 64 MB of text)
MAX_RENDER_S = 10.0  # and the time one render may take (a real one takes milliseconds)


class _RenderOverrun(Exception):
    """Raised inside a render that ran past MAX_RENDER_S (delivered by PyThreadState_SetAsyncExc)."""


def _bounded_str_join(seq: Any) -> str:
    """Jinja's `~` (runtime.str_join), refusing a result past MAX_PROMPT_CHARS before making it."""
    parts = [str(x) for x in seq]
    if sum(len(x) for x in parts) > MAX_PROMPT_CHARS:
        raise SecurityError(f"a joined text of over {MAX_PROMPT_CHARS} characters")
    return "".join(parts)


def _sized(value: Any) -> bool:
    return isinstance(value, (str, list, tuple))


def _run_bounded(work: Callable[[], str], seconds: float) -> str:
    """`work()` in a thread of its own, stopped by an exception raised into it if it runs past
    `seconds`. A template's loop is Python bytecode, so the exception reaches it at once; one long
    C call (a join of gigabytes) is not interrupted, and the caller goes on without waiting for it."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["text"] = work()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller, whatever it is
            box["error"] = exc

    thread = threading.Thread(target=run, name="chat-template", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive() and thread.ident is not None:
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident),
                                                   ctypes.py_object(_RenderOverrun))
        thread.join(1.0)
    if "text" in box:
        return box["text"]
    error = box.get("error")
    if error is None or isinstance(error, _RenderOverrun):
        raise SecurityError(f"a render of over {seconds:g} s")
    raise error


def _check_sizes(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Refuse a call or filter given a count past MAX_PROMPT_CHARS (`'x'.center(10**10)`,
    `x|indent(10**10)`): what it would make is at least that long."""
    for value in (*args, *kwargs.values()):
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_PROMPT_CHARS:
            raise SecurityError(f"a count of over {MAX_PROMPT_CHARS}")


def _bounded_filter(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """Filter `fn` refusing huge counts, and for `join` a result past MAX_PROMPT_CHARS before it is
    made (a list repeated 1 Mi times of a 1 MiB text would join to a terabyte)."""
    @functools.wraps(fn)  # keeps jinja_pass_arg, which says what Jinja passes first
    def bounded(*args: Any, **kwargs: Any) -> Any:
        _check_sizes(args, kwargs)
        if name == "join":
            head = 1 if getattr(fn, "jinja_pass_arg", None) is not None else 0
            items = list(args[head]) if len(args) > head else []
            if sum(len(x) if isinstance(x, str) else 32 for x in items) > MAX_PROMPT_CHARS:
                raise SecurityError(f"a joined text of over {MAX_PROMPT_CHARS} characters")
            args = (*args[:head], items, *args[head + 1:])
        return fn(*args, **kwargs)

    return bounded


class _TemplateSandbox(ImmutableSandboxedEnvironment):
    """Jinja's immutable sandbox, where `*`, `**`, `+`, `~`, calls and filters cannot fill the
    memory either."""

    intercepted_binops = frozenset({"*", "**", "+"})

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.filters = {name: _bounded_filter(name, fn) for name, fn in self.filters.items()}

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805 - Jinja's own signature
        _check_sizes(args, kwargs)
        return super().call(__context, __obj, *args, **kwargs)

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        if operator == "**" and isinstance(right, int) and abs(right) > MAX_EXPONENT:
            raise SecurityError(f"an exponent over {MAX_EXPONENT}")
        if operator == "*":
            seq, n = (left, right) if isinstance(right, int) else (right, left)
            if isinstance(seq, (str, list, tuple)) and isinstance(n, int) and len(seq) * n > MAX_REPEAT_CHARS:
                raise SecurityError(f"a repetition of over {MAX_REPEAT_CHARS} items")
        if operator == "+" and _sized(left) and _sized(right) and len(left) + len(right) > MAX_PROMPT_CHARS:
            raise SecurityError(f"a sum of over {MAX_PROMPT_CHARS} items")
        return super().call_binop(context, operator, left, right)


def why(exc: BaseException) -> str:
    """A template error in one line: Jinja's own message, or the Python error's kind and message."""
    text = str(exc).splitlines()[0] if str(exc) else ""
    if isinstance(exc, TemplateError):
        return text or type(exc).__name__
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def compile_template(source: str) -> Template:
    """`source` compiled in the sandbox, with what Hugging Face templates expect (module docstring).
    Raises whatever parsing raises (TemplateError, RecursionError for deep nesting)."""
    env = _TemplateSandbox(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols, _GenerationBlock])
    env.filters["tojson"] = _bounded_filter("tojson", _tojson)
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    template = env.from_string(source)
    # `~` compiles to a call of runtime.str_join, looked up in the template's own namespace
    template.root_render_func.__globals__["str_join"] = _bounded_str_join
    return template


def render_bounded(pieces: Callable[[], Iterator[str]]) -> str:
    """The text of `pieces()` (a template's generate), joined piece by piece so that a prompt past
    MAX_PROMPT_CHARS stops there, in a thread of its own stopped past MAX_RENDER_S. Raises what
    the template raised, or SecurityError."""
    def work() -> str:
        kept: list[str] = []
        size = 0
        for piece in pieces():
            size += len(piece)
            if size > MAX_PROMPT_CHARS:
                raise SecurityError(f"a prompt of over {MAX_PROMPT_CHARS} characters")
            kept.append(piece)
        return "".join(kept)

    return _run_bounded(work, MAX_RENDER_S)
