"""A calculator tool for the Search-R1 agent, living outside ``rlinf_ext/``: `<calculate> 2*(3+4) </calculate>`
-> `14`. Configured by import path: ``agentloop.searchr1.tools=[search,examples.plugins.calculator.tool:Calculator]``;
its own setting, ``tools.calculator.max_digits``, is its ``config_class`` (``CalculatorSettings``).

Arithmetic only (numbers, + - * / and parentheses), read with ``ast`` and evaluated node by node: no ``eval``, no
names, no calls, no powers (a huge exponent would stall the loop)."""

from __future__ import annotations

import ast
import operator
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from rlinf_ext.tools.base import SettingProblem, Tool, ToolContext, ToolOutput

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
MAX_EXPRESSION_CHARS = 200


class CalculatorError(ValueError):
    """An expression the calculator does not take."""


def evaluate(expression: str) -> float:
    """The value of an arithmetic expression; CalculatorError naming what is not allowed otherwise."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise CalculatorError(f"the expression is longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as exc:
        raise CalculatorError(f"not an arithmetic expression ({exc.msg})") from None
    return _value(tree.body)


def _value(node: ast.AST) -> float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _value(node.left), _value(node.right)
        if isinstance(node.op, ast.Div) and right == 0:
            raise CalculatorError("division by zero")
        return _BINARY[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_value(node.operand))
    raise CalculatorError(f"only numbers, + - * / and parentheses are allowed, not {ast.dump(node)[:40]}")


def format_number(value: float, max_digits: int = 12) -> str:
    """14.0 -> "14", 0.5 -> "0.5", 1/3 -> "0.333333333333" (at most ``max_digits`` significant digits; whole numbers
    without a decimal point)."""
    return f"{float(value):.{max_digits}g}"


@dataclass
class CalculatorSettings:
    """``tools.calculator.*``"""

    max_digits: int = field(default=12, metadata={"help": "Significant digits shown of a result."})

    def problems(self) -> Iterator[SettingProblem]:
        if self.max_digits < 1:
            yield SettingProblem(
                "max_digits", f"must be >= 1, got {self.max_digits}.", "set tools.calculator.max_digits=12."
            )


class Calculator(Tool):
    name = "calculator"
    tag = "calculate"
    instruction = "If I want to calculate, I should put the expression between <calculate> and </calculate>."
    config_class = CalculatorSettings

    def __init__(self, max_digits: int = 12):
        self.max_digits = max_digits

    @classmethod
    def from_config(cls, cfg: Any, context: ToolContext) -> "Calculator":
        return cls(cls.settings(cfg).max_digits)

    async def __call__(self, content: str) -> ToolOutput:
        try:
            return ToolOutput(body=format_number(evaluate(content), self.max_digits))
        except CalculatorError as exc:
            return ToolOutput(body=f"The calculation failed ({exc}).", ok=False, error=str(exc))
