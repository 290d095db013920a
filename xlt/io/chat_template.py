"""Chat templates compiled and rendered in a bounded jinja2 sandbox.

jinja2's immutable sandbox keeps a template from reaching Python's internals or changing what
it is given, but not from building: `{{ 'x' * 10**10 }}` passes it and takes 10 GB before it
prints a character. Templates come with downloaded models (and mergekit YAMLs), so here every
value a template builds is bounded before it is built, and the render with it:

  - string / list repetition (`*`), concatenation (`+`, `~`), `%` formatting, and the results of
    filters and method calls: at most MAX_VALUE characters or items each, refused before the
    repetition or concatenation allocates;
  - integer arguments of calls and filters (`center(10**9)`, `lipsum(10**9)`, `'{:>{w}}'`), and
    huge powers / products of integers;
  - `range`: at most MAX_RANGE items;
  - everything a render builds, the output included, at most MAX_BUDGET in all (a loop that
    keeps doubling a namespace's string stops there); the output is streamed and stops past
    MAX_VALUE characters.

A bound passed raises BoundError, a jinja2 SecurityError, so callers report it as the sandbox
stopping the template. Used by xlt.hf_tokenizer (every chat-template route: generate --chat,
chat data, xlt.eval --apply_chat_template, merge_search --chat) and xlt.merge.chat (a mergekit
chat_template, rendered once before it is written). Standard library and jinja2 only.
"""

from __future__ import annotations

import contextvars
import datetime
import functools
import json
import re

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2 import compiler
from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError

# A chat prompt of 16M characters is far past any model's context; the budget leaves room for
# templates that accumulate a string message by message.
MAX_VALUE = 1 << 24
MAX_BUDGET = 1 << 26
MAX_RANGE = 100_000
MAX_INT_BITS = 1 << 16
# what a written template is tried on: roles most templates accept (some refuse a system turn)
SAMPLE = [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi"},
          {"role": "user", "content": "2 + 2?"}]
_spent: contextvars.ContextVar[list[int] | None] = contextvars.ContextVar("chat_template_budget", default=None)


class BoundError(SecurityError):
  """A chat template built (or was about to build) past a bound: the sandbox stopped it."""


# a width or precision of as many digits as MAX_VALUE has, in a `%` spec or a str.format field
_DIGITS = len(str(MAX_VALUE))
_PERCENT_WIDTH = re.compile(r"%%(?:\([^)]*\))?[#0 +-]*(?:\d{%d,}|\d*\.\d{%d,})" % (_DIGITS, _DIGITS))
_FORMAT_WIDTH = re.compile(r"\{[^{}]*:[^{}]*\d{%d,}[^{}]*\}" % _DIGITS)


def _size(x) -> int:
  return len(x) if isinstance(x, (str, bytes, list, tuple, dict, set, frozenset)) else 0


def _charge(n: int, what: str) -> None:
  """Counts `n` characters / items built against the value bound and the render's budget."""
  if n > MAX_VALUE:
    raise BoundError(f"it builds {what} of {n:,} characters or items, over the {MAX_VALUE:,} limit")
  spent = _spent.get()
  if spent is not None:
    spent[0] += n
    if spent[0] > MAX_BUDGET:
      raise BoundError(f"it builds over {MAX_BUDGET:,} characters or items in one render")


def _check_ints(values) -> None:
  for v in values:
    if isinstance(v, int) and not isinstance(v, bool) and abs(v) > MAX_VALUE:
      raise BoundError(f"an argument of {v:,} is over the {MAX_VALUE:,} limit on sizes")


def _binop_size(op: str, a, b) -> int:
  """The size of `a op b`, before it is computed (0 where it builds nothing sized)."""
  ints = isinstance(a, int) and isinstance(b, int)
  if op == "*" and ints:
    if a.bit_length() + b.bit_length() > MAX_INT_BITS:
      raise BoundError(f"it multiplies integers past the {MAX_INT_BITS:,}-bit limit")
  elif op == "*" and (isinstance(b, int) and _size(a) or isinstance(a, int) and _size(b)):
    return max(_size(a), _size(b)) * max(0, a if isinstance(a, int) else b)
  elif op == "**" and ints and abs(a) > 1 and b > 0 and b * a.bit_length() > MAX_INT_BITS:
    raise BoundError(f"{a} ** {b} is over the {MAX_INT_BITS:,}-bit limit on integers")
  elif op == "+":
    return _size(a) + _size(b)
  elif op == "%" and isinstance(a, str):
    _check_ints(b if isinstance(b, tuple) else (b,))
    if _PERCENT_WIDTH.search(a):
      raise BoundError(f"a format width is over the {MAX_VALUE:,} limit")
    return len(a)
  return 0


class _Generator(compiler.CodeGenerator):
  """`a ~ b` through the environment, as the intercepted binary operators are."""

  @compiler.optimizeconst
  def visit_Concat(self, node, frame):
    self.write("environment.bounded_concat((")
    for arg in node.nodes:
      self.visit(arg, frame)
      self.write(", ")
    self.write("))")


class _Bounded(ImmutableSandboxedEnvironment):
  """The immutable sandbox with every operator, call and filter that builds a value bounded."""
  code_generator_class = _Generator
  intercepted_binops = frozenset({"*", "+", "**", "%"})

  def call_binop(self, context, operator, left, right):
    _charge(_binop_size(operator, left, right), f"a value (`{operator}`)")
    return super().call_binop(context, operator, left, right)

  def bounded_concat(self, parts):
    text = [str(p) for p in parts]
    _charge(sum(map(len, text)), "a string (`~`)")
    return "".join(text)

  def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805  (jinja2's own signature)
    _check_ints((*args, *kwargs.values()))
    bound = getattr(getattr(__obj, "__wrapped__", __obj), "__self__", None)
    if isinstance(bound, str):
      _check_str_method(bound, getattr(__obj, "__name__", ""), args)
    out = super().call(__context, __obj, *args, **kwargs)
    _charge(_size(out), f"a value (`{getattr(__obj, '__name__', 'a call')}`)")
    return out


def _check_str_method(s: str, name: str, args) -> None:
  """The size a string method may build, before it builds it (its int arguments are checked)."""
  if name in ("format", "format_map") and _FORMAT_WIDTH.search(s):
    raise BoundError(f"a format width is over the {MAX_VALUE:,} limit")
  if name == "replace" and len(args) >= 2 and isinstance(args[0], str) and isinstance(args[1], str):
    _charge(len(s) + (s.count(args[0]) if args[0] else len(s) + 1) * len(args[1]), "a string (`replace`)")
  if name == "join" and args:
    _charge(sum(len(x) for x in args[0] if isinstance(x, str)) if isinstance(args[0], (list, tuple)) else 0,
            "a string (`join`)")


def _bounded_filter(f):
  @functools.wraps(f)
  def wrapper(*args, **kwargs):
    _check_ints((*args[1 + hasattr(f, "jinja_pass_arg"):], *kwargs.values()))  # not the value filtered
    if f.__name__ == "do_join" and len(args) > 1 and isinstance(args[1], (list, tuple)):
      _charge(sum(_size(x) for x in args[1]), "a string (`join`)")
    if f.__name__ == "do_replace" and len(args) > 3 and all(isinstance(a, str) for a in args[1:4]):
      s, old, new = args[1:4]
      _charge(len(s) + (s.count(old) if old else len(s) + 1) * len(new), "a string (`replace`)")
    out = f(*args, **kwargs)
    _charge(_size(out), f"a value (`{f.__name__.removeprefix('do_')}`)")
    return out

  return wrapper


def compile(template: str):  # noqa: A001  (the module's verb: chat_template.compile)
  """`template` compiled in the bounded immutable sandbox with transformers' globals and filters
  (`raise_exception`, `strftime_now`, a `tojson` that does not escape HTML, `{% generation %}`)."""
  def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)

  def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

  def safe_range(*args):
    r = range(*args)
    if len(r) > MAX_RANGE:
      raise BoundError(f"range of {len(r):,} items is over the {MAX_RANGE:,} limit")
    _charge(len(r), "a range")
    return r

  env = _Bounded(trim_blocks=True, lstrip_blocks=True, extensions=[_Generation, jinja2.ext.loopcontrols])
  env.filters["tojson"] = tojson
  env.filters = {k: _bounded_filter(f) for k, f in env.filters.items()}
  env.globals["raise_exception"] = raise_exception
  env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
  env.globals["range"] = safe_range
  return env.from_string(template)


def render(compiled, **context) -> str:
  """`compiled` (from `compile`) rendered with `context`, streamed: it stops with BoundError as
  soon as the output or what the template builds passes its bound."""
  token = _spent.set([0])
  try:
    out, n = [], 0
    for chunk in compiled.generate(**context):
      n += len(chunk)
      if n > MAX_VALUE:
        raise BoundError(f"its output passes the {MAX_VALUE:,}-character limit")
      out.append(chunk)
    return "".join(out)
  finally:
    _spent.reset(token)


class _Generation(jinja2.ext.Extension):
  """`{% generation %}...{% endgeneration %}` (transformers marks the assistant's tokens with
  it, for training masks): parsed, and rendered as its body."""
  tags = {"generation"}

  def parse(self, parser):
    lineno = next(parser.stream).lineno
    body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
    return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

  def _body(self, caller):
    return caller()
