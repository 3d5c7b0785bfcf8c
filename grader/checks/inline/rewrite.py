"""Rewriting the check sites: each ``assert``, ``assert_*`` call, ``pytest.raises`` block and
doctest example of one copy of a test cell's tree becomes a call that records its operands, the
comparison kept as a skeleton over them (:class:`_Rewriter`)."""
from __future__ import annotations

import ast

from grader.checks.inline.sites import CHECK, RAISED, RAISES, VALUES, InlineError, Site
from grader.checks.inline.taint import _Taint


def _is_raises(item: ast.withitem) -> bool:
    call = item.context_expr
    if not isinstance(call, ast.Call):
        return False
    func = call.func
    return (isinstance(func, ast.Attribute) and func.attr == RAISES) or (isinstance(func, ast.Name) and func.id == RAISES)


def _assert_call(node: ast.stmt, taint: _Taint) -> bool:
    """``np.testing.assert_allclose(...)``, ``torch.testing.assert_close(...)``: a statement
    calling an ``assert*`` function that is not the student's."""
    if not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)):
        return False
    func = node.value.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
    return name.startswith("assert") and not taint.node(func)


class _Rewriter:
    """Rewrites one copy of a test cell's tree: each check site becomes a call of CHECK (or a
    try block calling RAISED) with its operands; ``sandbox`` leaves out the untainted ones."""

    def __init__(self, taint: _Taint, text: str):
        self.taint, self.text = taint, text
        self.sites: list[Site] = []
        self.sandbox = False

    def rewrite(self, tree: ast.Module, sandbox: bool) -> ast.Module:
        self.sandbox, self.sites = sandbox, []
        tree.body = self._block(tree.body)
        return ast.fix_missing_locations(tree)

    def _tainted(self, node: ast.AST) -> bool:
        return self.taint.node(node)

    def _block(self, body: list[ast.stmt]) -> list[ast.stmt]:
        out: list[ast.stmt] = []
        for node in body:
            out.extend(self._statement(node))
        return out or [ast.Pass()]

    def _statement(self, node: ast.stmt) -> list[ast.stmt]:
        for field in ("body", "orelse", "finalbody"):
            if isinstance(getattr(node, field, None), list) and not isinstance(node, (ast.With, ast.AsyncWith)):
                setattr(node, field, self._block(getattr(node, field)) if getattr(node, field) else [])
        if isinstance(node, ast.Try):
            for handler in node.handlers:
                handler.body = self._block(handler.body)
        if isinstance(node, ast.Assert):
            message = node.msg.value if isinstance(node.msg, ast.Constant) and isinstance(node.msg.value, str) else ""
            return [self._site(node, "assert", node.test, message)]
        if _assert_call(node, self.taint):
            return [self._site(node, "call", node.value, "")]  # type: ignore[attr-defined]
        if isinstance(node, ast.Expr) and hasattr(node, "g2c_want"):
            return [self._example(node)]
        if isinstance(node, (ast.With, ast.AsyncWith)):
            return self._with(node)
        return [node]

    def _with(self, node: ast.With | ast.AsyncWith) -> list[ast.stmt]:
        node.body = self._block(node.body)
        raises = [item for item in node.items if _is_raises(item)]
        if not raises:
            return [node]
        if len(node.items) != 1 or raises[0].optional_vars is not None:
            raise InlineError(f"line {node.lineno}: a pytest.raises block is supported alone and without `as` "
                              "(check the message with match=)")
        call = raises[0].context_expr
        assert isinstance(call, ast.Call)
        arguments = [*call.args, *(k.value for k in call.keywords)]
        if any(self._tainted(a) for a in arguments) or any(k.arg not in ("match", None) for k in call.keywords):
            raise InlineError(f"line {node.lineno}: pytest.raises takes the expected exception and match= here, "
                              "neither computed from the student's code")
        expected = call.args[0] if call.args else None
        match = next((k.value for k in call.keywords if k.arg == "match"), ast.Constant(None))
        if expected is None:
            raise InlineError(f"line {node.lineno}: pytest.raises needs the expected exception")
        return [self._raising(node, node.body, [expected, match], "raises", "")]

    def _raising(self, at: ast.AST, body: list[ast.stmt], operands: list[ast.expr], kind: str, want: str,
                 flags: int = 0) -> ast.stmt:
        """``try: body / except BaseException as e: RAISED(k, e, ops) / else: RAISED(k, None, ops)``."""
        index = len(self.sites)
        self.sites.append(Site(index, at.lineno, self._text(at), kind, "", tuple(map(ast.unparse, operands)),
                               (False,) * len(operands), want=want, flags=flags))
        values = [] if self.sandbox else [ast.Tuple(elts=operands, ctx=ast.Load())]
        caught = "__g2c_exception__"

        def record(exception: ast.expr) -> ast.stmt:
            return ast.Expr(ast.Call(ast.Name(RAISED, ast.Load()), [ast.Constant(index), exception, *values], []))
        return ast.Try(body=body, handlers=[ast.ExceptHandler(ast.Name("BaseException", ast.Load()), caught,
                                                              [record(ast.Name(caught, ast.Load()))])],
                       orelse=[record(ast.Constant(None))], finalbody=[])

    def _example(self, node: ast.Expr) -> ast.stmt:
        """A doctest example whose last statement is an expression."""
        want, exc, flags = node.g2c_want, node.g2c_exc, node.g2c_flags  # type: ignore[attr-defined]
        value = node.value
        if exc is not None:
            return self._raising(node, [ast.Expr(value)], [], "doctest_raises", exc, flags)
        if (isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "print"
                and not self._tainted(value.func)):
            if any(isinstance(a, ast.Starred) for a in value.args) or \
                    any(k.arg not in ("sep", "end") or self._tainted(k.value) for k in value.keywords):
                raise InlineError(f"line {node.lineno}: a print example takes plain arguments and constant sep=/end=")
            operands = [*value.args, *(k.value for k in value.keywords)]
            names = [None] * len(value.args) + [k.arg for k in value.keywords]
            skeleton = repr(names)   # which operand is which: positional (None), sep or end
            return self._record(node, "print", operands, skeleton, "", want, flags)
        return self._record(node, "doctest", [value], "", "", want, flags)

    def _site(self, node: ast.stmt, kind: str, expression: ast.expr, message: str) -> ast.stmt:
        operands: list[ast.expr] = []
        skeleton = self._decompose(expression, operands)
        return self._record(node, kind, operands, ast.unparse(skeleton), message, "", 0)

    def _record(self, node: ast.stmt, kind: str, operands: list[ast.expr], skeleton: str, message: str,
                want: str, flags: int) -> ast.stmt:
        index = len(self.sites)
        tainted = tuple(self._tainted(o) for o in operands)
        self.sites.append(Site(index, node.lineno, self._text(node), kind, skeleton,
                               tuple(ast.unparse(o) for o in operands), tainted, message, want, flags))
        sent = [o for o, t in zip(operands, tainted) if t] if self.sandbox else operands
        call = ast.Call(ast.Name(CHECK, ast.Load()), [ast.Constant(index), ast.Tuple(elts=sent, ctx=ast.Load())], [])
        return ast.copy_location(ast.Expr(call), node)

    def _decompose(self, node: ast.expr, operands: list[ast.expr]) -> ast.expr:
        """The skeleton of ``node``: its comparisons, arithmetic, ``not``, ``and`` and calls of
        functions that are not the student's, over operands; ``operands`` gets each operand."""
        def operand(part: ast.expr) -> ast.expr:
            operands.append(part)
            return ast.Subscript(ast.Name(VALUES, ast.Load()), ast.Constant(len(operands) - 1), ast.Load())
        if not self._tainted(node):
            return operand(node)
        if isinstance(node, ast.Compare):
            return ast.Compare(self._decompose(node.left, operands), node.ops,
                               [self._decompose(c, operands) for c in node.comparators])
        if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.And):
            return ast.BoolOp(node.op, [self._decompose(v, operands) for v in node.values])
        if isinstance(node, ast.UnaryOp):
            return ast.UnaryOp(node.op, self._decompose(node.operand, operands))
        if isinstance(node, ast.BinOp):
            return ast.BinOp(self._decompose(node.left, operands), node.op, self._decompose(node.right, operands))
        if (isinstance(node, ast.Call) and not self._tainted(node.func)
                and not any(isinstance(a, ast.Starred) for a in node.args) and all(k.arg for k in node.keywords)):
            func = operand(node.func)
            return ast.Call(func, [self._decompose(a, operands) for a in node.args],
                            [ast.keyword(k.arg, self._decompose(k.value, operands)) for k in node.keywords])
        return operand(node)

    def _text(self, node: ast.AST) -> str:
        found = ast.get_source_segment(self.text, node) if not hasattr(node, "g2c_want") else None
        return " ".join((found or ast.unparse(node)).split())[:300]
