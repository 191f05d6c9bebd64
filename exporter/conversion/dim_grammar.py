"""The text of a symbolic dim, read by a grammar of our own: never by an evaluator.

A dim's text comes from a manifest, which may come from anyone, so it is parsed, not evaluated:

    expr  := term (("+" | "-") term)*
    term  := unary (("*" | "//" | "%") unary)*
    unary := "-" unary | atom
    atom  := INTEGER | FUNCTION "(" expr ("," expr)* ")" | NAME | "(" expr ")"

NAME is an identifier (``batch``, ``s77``); every name is an integer symbol. FUNCTION is one of ``FUNCTIONS``, the
integer functions torch prints in sizes (``Min(3, s33)``: a size clamped by a slice or QR's reduced factor). ``//`` is torch's ``FloorDiv``, ``%``
its ``Mod``; both print back in this grammar (``(s0//2)``, ``(s0 % 3)``), as sympy's ``+ - *`` do. Texts longer
than ``MAX_LENGTH`` characters or nested deeper than ``MAX_DEPTH`` parentheses are refused.
"""
from __future__ import annotations

import re

import sympy
from torch.utils._sympy.functions import CeilDiv, FloorDiv, Max, Min, Mod, PythonMod

MAX_LENGTH = 256
MAX_DEPTH = 16
_TOKEN = re.compile(r"\s*(?:(\d+)|([A-Za-z_]\w*)|(//|[-+*%(),]))")


class _Mod(Mod):
    """torch's ``Mod``, printed as ``(a % b)``."""

    def _sympystr(self, printer) -> str:
        return f"({printer._print(self.args[0])} % {printer._print(self.args[1])})"


FUNCTIONS = {"Min": Min, "Max": Max, "Mod": _Mod, "PythonMod": PythonMod, "FloorDiv": FloorDiv, "CeilDiv": CeilDiv}


class DimSyntaxError(ValueError):
    """A dim's text is not in the grammar above; the message says where and what was expected."""


def parse(text: str) -> sympy.Expr:
    """The sympy expression of ``text`` (see the module docstring); raises DimSyntaxError."""
    if not isinstance(text, str) or len(text) > MAX_LENGTH:
        raise DimSyntaxError(f"a symbolic dim is a text of at most {MAX_LENGTH} characters, got {_shown(text)}")
    parser = _Parser(text, _tokens(text))
    try:
        expr = parser.expr(0)
    except DimSyntaxError:
        raise
    except (ZeroDivisionError, TypeError, ValueError) as error:  # sympy's, e.g. for a division by zero
        raise DimSyntaxError(f"symbolic dim {text!r} cannot be evaluated: {error}") from None
    if parser.peek() is not None:
        raise DimSyntaxError(f"symbolic dim {text!r}: unexpected {parser.peek()!r} after a complete expression")
    return expr


def _shown(text) -> str:
    return f"{len(text)} characters" if isinstance(text, str) else type(text).__name__


def _tokens(text: str) -> list:
    tokens, position = [], 0
    for match in _TOKEN.finditer(text):
        if match.start() != position:
            break
        integer, name, symbol = match.groups()
        tokens.append(int(integer) if integer else sympy.Symbol(name, integer=True) if name else symbol)
        position = match.end()
    if text[position:].strip():
        raise DimSyntaxError(f"symbolic dim {text!r}: unexpected {text[position:].strip()[:20]!r} (a dim is names, "
                             "integers, + - * // %, parentheses and the functions " + ", ".join(FUNCTIONS) + ")")
    return tokens


class _Parser:
    def __init__(self, text: str, tokens: list):
        self.text, self.tokens, self.position = text, tokens, 0

    def peek(self):
        return self.tokens[self.position] if self.position < len(self.tokens) else None

    def take(self):
        token = self.peek()
        if token is None:
            raise DimSyntaxError(f"symbolic dim {self.text!r} ends early: expected a name, an integer or '('")
        self.position += 1
        return token

    def expr(self, depth: int) -> sympy.Expr:
        value = self.term(depth)
        while self.peek() in ("+", "-"):
            value = value + self.term(depth) if self.take() == "+" else value - self.term(depth)
        return value

    def term(self, depth: int) -> sympy.Expr:
        value = self.unary(depth)
        while self.peek() in ("*", "//", "%"):
            operator, right = self.take(), self.unary(depth)
            value = value * right if operator == "*" else FloorDiv(value, right) if operator == "//" else \
                _Mod(value, right)
        return value

    def unary(self, depth: int) -> sympy.Expr:
        if self.peek() == "-":
            self.take()
            return -self.unary(depth)
        return self.atom(depth)

    def atom(self, depth: int) -> sympy.Expr:
        token = self.take()
        if token == "(":
            if depth >= MAX_DEPTH:
                raise DimSyntaxError(f"symbolic dim {self.text!r} nests parentheses deeper than {MAX_DEPTH}")
            value = self.expr(depth + 1)
            if self.take() != ")":
                raise DimSyntaxError(f"symbolic dim {self.text!r}: expected ')'")
            return value
        if isinstance(token, str):
            raise DimSyntaxError(f"symbolic dim {self.text!r}: expected a name, an integer or '(', got {token!r}")
        if isinstance(token, sympy.Symbol) and token.name in FUNCTIONS and self.peek() == "(":
            return self.call(FUNCTIONS[token.name], depth)
        return sympy.Integer(token) if isinstance(token, int) else token

    def call(self, function, depth: int) -> sympy.Expr:
        """``function`` of the arguments after its name: ``(expr, expr, ...)``."""
        if depth >= MAX_DEPTH:
            raise DimSyntaxError(f"symbolic dim {self.text!r} nests parentheses deeper than {MAX_DEPTH}")
        self.take()
        arguments = [self.expr(depth + 1)]
        while self.peek() == ",":
            self.take()
            arguments.append(self.expr(depth + 1))
        if self.take() != ")":
            raise DimSyntaxError(f"symbolic dim {self.text!r}: expected ')' after a function's arguments")
        return function(*arguments)
