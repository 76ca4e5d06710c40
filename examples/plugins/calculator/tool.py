"""A calculator tool for the Search-R1 agent, living outside ``rlinf_ext/``: `<calculate> 2*(3+4) </calculate>`
-> `14`. Configured by import path: ``agentloop.searchr1.tools=[search,examples.plugins.calculator.tool:Calculator]``.

Arithmetic only (numbers, + - * / and parentheses), read with ``ast`` and evaluated node by node: no ``eval``, no
names, no calls, no powers (a huge exponent would stall the loop)."""

from __future__ import annotations

import ast
import operator

from rlinf_ext.tools.base import Tool, ToolOutput

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


def format_number(value: float) -> str:
    """14.0 -> "14", 0.5 -> "0.5" (whole numbers without a decimal point)."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


class Calculator(Tool):
    name = "calculator"
    tag = "calculate"
    instruction = "If I want to calculate, I should put the expression between <calculate> and </calculate>."

    async def __call__(self, content: str) -> ToolOutput:
        try:
            return ToolOutput(body=format_number(evaluate(content)))
        except CalculatorError as exc:
            return ToolOutput(body=f"The calculation failed ({exc}).", ok=False, error=str(exc))
