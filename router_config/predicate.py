"""A rule's `where` filter: a small SQL-like predicate over one row image's columns.

    where = "status != 'draft' AND (visibility IN ('public', 'friends') OR owner_id = 7)"

Grammar (keywords in any case): `OR` of `AND` of `[NOT]` atoms; an atom is `( ... )`, `column op literal`
(op: `= != <> < <= > >=`), `column IS [NOT] NULL` or `column [NOT] IN (literal, ...)`. A literal is a
single-quoted string (`''` is a quote inside it) or a number (`-12`, `3.5`). Columns are names like
`user_id` or backquoted.

Logic is SQL's three-valued one: a comparison with a NULL column is *unknown*, `NOT unknown` is unknown,
and a row image matches only when the whole predicate is true. Strings compare byte for byte (binary, case
sensitive: write values as stored); numbers compare as numbers.

The topology loader parses it (syntax errors name the rule); squeal evaluates it on row images, in Python
(`squeal.keys.rules`) and in the native reader, which gets the predicate as `steps` (postfix).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

OPERATORS = ("=", "!=", "<", "<=", ">", ">=")
_TOKEN = re.compile(
    r"""
    \s*(?:
      (?P<string>'(?:[^']|'')*')
    | (?P<number>[-+]?(?:\d+(?:\.\d*)?|\.\d+))
    | (?P<op><=|>=|<>|!=|=|<|>)
    | (?P<punct>[(),])
    | (?P<quoted>`[^`]+`)
    | (?P<word>[A-Za-z_][A-Za-z0-9_$]*)
    | (?P<bad>\S)
    )""",
    re.VERBOSE,
)
_KEYWORDS = {"AND", "OR", "NOT", "IS", "NULL", "IN"}


class PredicateError(ValueError):
    """A `where` predicate that does not parse; `offset` is where in the text (0-based)."""

    def __init__(self, message: str, offset: int) -> None:
        super().__init__(message)
        self.offset = offset


@dataclass(frozen=True)
class Literal:
    value: str  # the string's text, or the number as written (normalized: no leading '+')
    number: bool


@dataclass(frozen=True)
class Compare:
    column: str
    op: str  # one of OPERATORS (`<>` is read as `!=`)
    literal: Literal


@dataclass(frozen=True)
class IsNull:
    column: str


@dataclass(frozen=True)
class Not:
    operand: Node


@dataclass(frozen=True)
class BoolOp:
    op: str  # "and" | "or"
    operands: tuple[Node, ...]


Node = Compare | IsNull | Not | BoolOp


@dataclass(frozen=True)
class Predicate:
    source: str
    root: Node

    @property
    def columns(self) -> tuple[str, ...]:
        """Columns named, in order of first appearance."""
        out: dict[str, None] = {}
        _columns(self.root, out)
        return tuple(out)

    def comparisons(self) -> list[Compare]:
        out: list[Compare] = []
        _compares(self.root, out)
        return out

    def steps(self) -> list[tuple[str, str, str]]:
        """The predicate in postfix form for the native reader: (op, column, literal) per step, op one of
        `s<OP>` / `n<OP>` (compare as string / number), `null`, `not`, `and`, `or` (`and`/`or` take the top
        two values)."""
        out: list[tuple[str, str, str]] = []
        _postfix(self.root, out)
        return out


def _columns(node: Node, out: dict[str, None]) -> None:
    if isinstance(node, Compare | IsNull):
        out[node.column] = None
    elif isinstance(node, Not):
        _columns(node.operand, out)
    else:
        for n in node.operands:
            _columns(n, out)


def _compares(node: Node, out: list[Compare]) -> None:
    if isinstance(node, Compare):
        out.append(node)
    elif isinstance(node, Not):
        _compares(node.operand, out)
    elif isinstance(node, BoolOp):
        for n in node.operands:
            _compares(n, out)


def _postfix(node: Node, out: list[tuple[str, str, str]]) -> None:
    if isinstance(node, Compare):
        out.append((("n" if node.literal.number else "s") + node.op, node.column, node.literal.value))
    elif isinstance(node, IsNull):
        out.append(("null", node.column, ""))
    elif isinstance(node, Not):
        _postfix(node.operand, out)
        out.append(("not", "", ""))
    else:
        _postfix(node.operands[0], out)
        for n in node.operands[1:]:
            _postfix(n, out)
            out.append((node.op, "", ""))


def parse(text: str) -> Predicate:
    """The predicate `text` says, or PredicateError naming what is wrong and where."""
    return Predicate(text, _Parser(text).parse())


class _Parser:
    def __init__(self, text: str) -> None:
        self.tokens: list[tuple[str, str, int]] = []  # (kind, text, offset)
        for m in _TOKEN.finditer(text):
            kind = m.lastgroup
            if kind is None:
                continue  # trailing whitespace
            value, offset = m.group(kind), m.start(kind)
            if kind == "bad":
                raise PredicateError(f"unexpected character {value!r}", offset)
            if kind == "word" and value.upper() in _KEYWORDS:
                kind, value = "keyword", value.upper()
            self.tokens.append((kind, value, offset))
        self.text = text
        self.i = 0

    def parse(self) -> Node:
        if not self.tokens:
            raise PredicateError("empty predicate", 0)
        node = self.or_()
        if self.i < len(self.tokens):
            _, value, offset = self.tokens[self.i]
            raise PredicateError(f"unexpected {value!r} after a complete predicate (AND/OR missing?)", offset)
        return node

    def peek(self) -> tuple[str, str, int]:
        if self.i < len(self.tokens):
            return self.tokens[self.i]
        return ("end", "", len(self.text))

    def take(self, kind: str, value: str | None = None, what: str = "") -> str:
        k, v, offset = self.peek()
        if k != kind or (value is not None and v != value):
            found = "the end" if k == "end" else repr(v)
            raise PredicateError(f"expected {what or value or kind}, found {found}", offset)
        self.i += 1
        return v

    def accept(self, value: str) -> bool:
        k, v, _ = self.peek()
        if k in ("keyword", "punct") and v == value:
            self.i += 1
            return True
        return False

    def or_(self) -> Node:
        operands = [self.and_()]
        while self.accept("OR"):
            operands.append(self.and_())
        return operands[0] if len(operands) == 1 else BoolOp("or", tuple(operands))

    def and_(self) -> Node:
        operands = [self.not_()]
        while self.accept("AND"):
            operands.append(self.not_())
        return operands[0] if len(operands) == 1 else BoolOp("and", tuple(operands))

    def not_(self) -> Node:
        if self.accept("NOT"):
            return Not(self.not_())
        return self.atom()

    def atom(self) -> Node:
        node: Node
        if self.accept("("):
            node = self.or_()
            self.take("punct", ")", "')'")
            return node
        kind, value, offset = self.peek()
        if kind == "word":
            column = value
        elif kind == "quoted":
            column = value[1:-1]
        else:
            found = "the end" if kind == "end" else repr(value)
            raise PredicateError(f"expected a column name, found {found}", offset)
        self.i += 1
        if self.accept("IS"):
            negated = self.accept("NOT")
            self.take("keyword", "NULL", "NULL")
            return Not(IsNull(column)) if negated else IsNull(column)
        negated = self.accept("NOT")
        if self.accept("IN"):
            self.take("punct", "(", "'(' after IN")
            items = [self.literal()]
            while self.accept(","):
                items.append(self.literal())
            self.take("punct", ")", "')' or ','")
            node = (
                Compare(column, "=", items[0])
                if len(items) == 1
                else BoolOp("or", tuple(Compare(column, "=", lit) for lit in items))
            )
            return Not(node) if negated else node
        if negated:
            raise PredicateError(f"expected IN after {column} NOT", self.peek()[2])
        op = self.take("op", what=f"a comparison (=, !=, <, <=, >, >=, IS NULL, IN) after {column}")
        return Compare(column, "!=" if op == "<>" else op, self.literal())

    def literal(self) -> Literal:
        kind, value, offset = self.peek()
        if kind == "string":
            self.i += 1
            return Literal(value[1:-1].replace("''", "'"), number=False)
        if kind == "number":
            self.i += 1
            number = value.lstrip("+")
            number = re.sub(r"^(-?)\.", r"\g<1>0.", number)  # ".5" -> "0.5", "5." -> "5.0": one spelling
            return Literal(number + "0" if number.endswith(".") else number, number=True)
        if kind == "keyword" and value == "NULL":
            raise PredicateError(
                "a comparison with NULL is never true in SQL: write `column IS NULL` or `column IS NOT NULL`", offset
            )
        found = "the end" if kind == "end" else repr(value)
        raise PredicateError(f"expected a 'string' or a number, found {found}", offset)
